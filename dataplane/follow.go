package dataplane

// Following the host at run time. The host's public interface changes
// while containers run: a DHCP lease brings a new address, a router a new
// gateway, an operator a lower MTU, a driver reload a new eth0. One
// netlink subscription (links, IPv4 and IPv6 addresses, IPv4 and IPv6
// routes of the host namespace, no polling) tells the follower that
// something of eth0 or lo changed; it waits for the burst to end
// (followQuiet after the last event, followMaxDelay after the first) and
// then reads the host's facts again (followsync.go). When they differ
// from what the data plane holds, the host's own tables change first
// (the eth0 demux's address, lo's MAC, the neighbour sync) and then each
// container (followsync.go): its host side (veth, filters) under d.mu
// alone, so that API calls go on between containers, its namespace
// without it, two at a time. A container that
// cannot be brought in line is logged, counted and tried again after
// followRetry; it never holds up the others.

import (
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/isolatord/isolatord/isolator/plane"
)

const (
	// followQuiet: a burst of changes is over when nothing came for
	// this long.
	followQuiet = 150 * time.Millisecond
	// followMaxDelay bounds the wait for a burst's end (a flapping link).
	followMaxDelay = 600 * time.Millisecond
	// followRetry: containers not brought in line are tried again after
	// this long (and with every later change).
	followRetry = 500 * time.Millisecond
	// followResubscribe: a subscription that ended (its socket overflowed)
	// is made again after this long, then everything is read again.
	followResubscribe = 100 * time.Millisecond
	// followQueue and followBuffer hold the notifications that come
	// while a pass runs (every host veth's own changes are link
	// notifications of the host namespace too: a pass over 1,000
	// containers makes 1,000 or more); beyond them the subscription
	// overflows, ends, and is made again with a pass (nothing is lost).
	followQueue  = 1024
	followBuffer = 1 << 20
)

// follower is the goroutine that follows the host (nil when Config.Follow
// is off).
type follower struct {
	stop chan struct{}
	done chan struct{}
	poke chan struct{} // a pass is wanted (a container needs one)
}

// FollowStats returns the follower's counters.
func (d *DataPlane) FollowStats() plane.FollowStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.followStats
	st.Events = d.followEvents.Load()
	for _, r := range d.ctrs {
		if r.in != d.hostNow {
			st.Pending++
		}
	}
	return st
}

// OnHostChange sets fn to be called (from the follower's goroutine, never
// with a lock of the data plane held) with the host's facts after each
// change the follower applied.
func (d *DataPlane) OnHostChange(fn func(plane.HostInfo)) {
	d.mu.Lock()
	d.onHost = fn
	d.mu.Unlock()
}

// startFollower starts following the host (d.mu held, host prepared).
func (d *DataPlane) startFollower() {
	if !d.cfg.Follow || d.follow != nil {
		return
	}
	f := &follower{stop: make(chan struct{}), done: make(chan struct{}), poke: make(chan struct{}, 1)}
	d.follow = f
	d.watchLinks()
	go d.followLoop(f)
}

// stopFollower ends the follower and waits for it (without d.mu).
func (f *follower) stopAndWait() {
	if f == nil {
		return
	}
	close(f.stop)
	<-f.done
}

// pokeFollower asks the follower for a pass (non-blocking).
func (d *DataPlane) pokeFollower() {
	if d.follow == nil {
		return
	}
	select {
	case d.follow.poke <- struct{}{}:
	default:
	}
}

// subscription is one netlink subscription to the host's links,
// addresses and routes; any of its channels closing ends it.
type subscription struct {
	links  chan netlink.LinkUpdate
	addrs  chan netlink.AddrUpdate
	routes chan netlink.RouteUpdate
	done   chan struct{}
}

func (d *DataPlane) subscribe() (*subscription, error) {
	s := &subscription{
		links:  make(chan netlink.LinkUpdate, followQueue),
		addrs:  make(chan netlink.AddrUpdate, followQueue),
		routes: make(chan netlink.RouteUpdate, followQueue),
		done:   make(chan struct{}),
	}
	ns := netns.NsHandle(d.hostNS.Fd())
	onErr := func(err error) {
		select {
		case <-s.done: // ended by us
		default:
			d.log.Warn("host follower: netlink subscription ended; subscribing again", "err", err)
		}
	}
	err := netlink.LinkSubscribeWithOptions(s.links, s.done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr,
		ReceiveBufferSize: followBuffer, ReceiveBufferForceSize: true})
	if err == nil {
		err = netlink.AddrSubscribeWithOptions(s.addrs, s.done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onErr,
			ReceiveBufferSize: followBuffer, ReceiveBufferForceSize: true})
	}
	if err == nil {
		err = netlink.RouteSubscribeWithOptions(s.routes, s.done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr,
			ReceiveBufferSize: followBuffer, ReceiveBufferForceSize: true})
	}
	if err != nil {
		close(s.done)
		return nil, err
	}
	return s, nil
}

// followLoop runs the follower until stop.
func (d *DataPlane) followLoop(f *follower) {
	defer close(f.done)
	var sub *subscription
	defer func() {
		if sub != nil {
			close(sub.done)
		}
	}()
	var (
		first, last time.Time // of the burst waited for (zero: none)
		retryAt     time.Time // a pass for containers not in line (zero: none)
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if sub == nil {
			s, err := d.subscribe()
			if err != nil {
				d.log.Warn("host follower: cannot subscribe to the host's changes; trying again", "err", err)
				retryAt = time.Now().Add(followRetry)
			} else {
				sub = s
				// Changes may have come before: read the host once.
				first, last = time.Now(), time.Now()
			}
		}
		// When to wake up: the burst's end, a retry.
		var wake time.Time
		if !first.IsZero() {
			wake = last.Add(followQuiet)
			if m := first.Add(followMaxDelay); m.Before(wake) {
				wake = m
			}
		}
		if !retryAt.IsZero() && (wake.IsZero() || retryAt.Before(wake)) {
			wake = retryAt
		}
		if !wake.IsZero() {
			timer.Reset(max(time.Until(wake), 0))
		}
		var links chan netlink.LinkUpdate
		var addrs chan netlink.AddrUpdate
		var routes chan netlink.RouteUpdate
		if sub != nil {
			links, addrs, routes = sub.links, sub.addrs, sub.routes
		}
		relevant, ended := false, false
		select {
		case <-f.stop:
			return
		case <-f.poke:
			relevant = true
		case u, ok := <-links:
			ended = !ok
			relevant = ok && d.concernsHost(u.Attrs().Index, u.Attrs().Name)
		case u, ok := <-addrs:
			ended = !ok
			// (another link's IPv6 address: source selection, saddr6.go)
			relevant = ok && (d.concernsHost(u.LinkIndex, "") || saddr6Event(u.LinkAddress.IP))
		case u, ok := <-routes:
			ended = !ok
			relevant = ok && d.concernsHost(u.LinkIndex, "")
		case <-timer.C:
			if wake.IsZero() || time.Now().Before(wake) {
				continue
			}
			first, last, retryAt = time.Time{}, time.Time{}, time.Time{}
			if !d.followPass() {
				retryAt = time.Now().Add(followRetry)
			}
			continue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if ended {
			close(sub.done)
			sub = nil
			d.mu.Lock()
			d.followStats.Resyncs++
			d.mu.Unlock()
			select {
			case <-f.stop:
				return
			case <-time.After(followResubscribe):
			}
			continue
		}
		if relevant {
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
		}
	}
}

// watched are the links whose notifications count (concernsHost).
type watched struct {
	eth0, lo int
	name     string
}

// watchLinks records eth0 and lo as the follower looks for them (d.mu
// held).
func (d *DataPlane) watchLinks() {
	d.watching.Store(&watched{eth0: d.links.Eth0Index, lo: d.links.LoIndex, name: d.links.Eth0})
}

// concernsHost says whether a notification about link index (or name)
// may change what containers copy: the host's eth0 (by index, or by name
// when it is made again) or lo. It takes no lock: every setup's veth is
// a notification too.
func (d *DataPlane) concernsHost(index int, name string) bool {
	w := d.watching.Load()
	if w == nil {
		return false
	}
	ok := index == w.eth0 || index == w.lo || (name != "" && name == w.name)
	if ok {
		d.followEvents.Add(1)
	}
	return ok
}
