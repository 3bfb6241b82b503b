package dataplane

import (
	"net"
	"testing"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

// TestFragmentTenantCannotStealHostDatagrams: a hostile tenant tries to
// teach the fragment table that an id of the host's own address pair is
// its (a first fragment it sends to its own port through the host IP,
// crafted with a packet socket on its lo): the fragment reaches it, but
// nothing coming from lo is learned (else one tenant could fill the
// shared table at local speed, or claim keys of others' datagrams over
// lo). The host's own datagram with that id to a host port then reaches
// the host whole and none of its fragments reaches the tenant's veth.
func TestFragmentTenantCannotStealHostDatagrams(t *testing.T) {
	checkRootUnchanged(t)
	e := newEnv(t)
	c := e.start("C", 1, "40960-41983", "31000-31009", "", 31000)
	serveIn(t, e.sb.Host, "0.0.0.0:8000", "host")
	capt := traffic.StartCapture(t, e.sb.Host.Do, plane.VethName(c.c.ID), "C's veth")
	host := sandbox.HostIP
	const id = 0x5151
	sendOn := func(ns doer, ifname string, frames [][]byte) {
		t.Helper()
		err := ns.Do(func() error {
			s, err := traffic.OpenFrameSender(ifname)
			if err != nil {
				return err
			}
			defer s.Close()
			for _, f := range frames {
				if err := s.Send(f); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	mac := e.info.MAC
	// the tenant's first fragment, own source and destination ports
	before := fragStats(t, e)
	poison := fragTrain(mac, mac, host, host, 31001, 31000, id, []byte(bigMsg("mine", 2000)), 1500)
	sendOn(c.proc, "lo", poison[:1])
	key := fragKey{host.String(), id}
	carried := func() int { return fragments(capt.Outgoing())[key] }
	wait.For(t, 5*time.Second, "the tenant's first fragment at its veth", func() bool { return carried() >= 1 })
	if got := fragStats(t, e).Learned; got != before.Learned {
		t.Errorf("the tenant's first fragment over lo was learned: %d entries learned, want %d", got, before.Learned)
	}
	// the host's own datagram with that id, to a host port
	pc := udpListenIn(t, e.sb.Host, hostAddr(20000))
	msg := bigMsg("host-own", 4000)
	train := fragTrain(mac, mac, host, host, 20000, 8000, id, []byte(msg), 1500)
	mid := fragStats(t, e)
	sendOn(e.sb.Host, "lo", train)
	if got := reply(pc, 3*time.Second); got != "host "+msg+"\n" {
		t.Errorf("the host's datagram after the tenant's first fragment: reply %.40q, want the host's echo", got)
	}
	after := fragStats(t, e)
	if d := after.Steered4 - mid.Steered4; d != 0 {
		t.Errorf("%d of the host's later fragments steered", d)
	}
	if d := after.Host4 - mid.Host4; d != uint64(len(train)-1) {
		t.Errorf("%d of the host's later fragments left to the host, want %d", d, len(train)-1)
	}
	if n := carried(); n != 1 {
		t.Errorf("the tenant's veth carried %d fragments of id %#x, want 1 (its own first fragment)", n, id)
	}
}

// udpListenIn binds a UDP socket in ns.
func udpListenIn(t testing.TB, ns doer, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}
