package main

// ARP and ICMP amplification. In S1 (1 container) and SN (N containers), the
// client namespace sends, at a fixed rate, each kind of message a LAN sends
// a host: broadcast ARP requests for another address, ARP replies to the
// host, ICMP errors (frag-needed) quoting a container's flow, echo replies
// with a container's identifier and with an identifier nobody owns. For
// each kind: the copies delivered to containers per message (the sum of
// the tx packets of every container veth's host end, divided by the
// messages the host's eth0 received) and the machine's softirq CPU while
// sending (/proc/stat; machine-wide, so other work on the machine adds to
// it). Targets: no copy of an ARP frame, one per ICMP error and per
// attributable echo reply; every figure at N within 1.3x of the one at 1.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
)

// Kinds of the amplification measurements.
const (
	ampARPOther  = "arp_request_other"
	ampARPReply  = "arp_reply"
	ampICMPError = "icmp_error"
	ampICMPHost  = "icmp_error_host" // about a flow of the host's own: stays with the host
	ampEchoOwned = "echo_reply_owned"
	ampEchoOther = "echo_reply_unowned"
	ampIdle      = "idle" // nothing sent: the softirq baseline
)

var ampKinds = []string{ampIdle, ampARPOther, ampARPReply, ampICMPError, ampICMPHost, ampEchoOwned, ampEchoOther, ampIdle + "_after"}

// isIdle reports whether kind sends nothing.
func isIdle(kind string) bool { return strings.HasPrefix(kind, ampIdle) }

// ampTargetCopies are the copies per message aimed at (-1: flat in N only).
var ampTargetCopies = map[string]float64{ampARPOther: 0, ampARPReply: 0, ampICMPError: 1, ampICMPHost: 0, ampEchoOwned: 1, ampEchoOther: -1}

// Amplification are the ARP/ICMP figures (see amplify.go).
type Amplification struct {
	Rate     int                            `json:"rate_per_second"`     // messages per second sent
	Seconds  float64                        `json:"seconds"`             // per kind and sandbox
	Messages map[string]map[string]int64    `json:"messages"`            // sandbox (s1, sn) -> kind -> received by host eth0
	Copies   map[string]map[string]*float64 `json:"copies_per_message"`  // sandbox -> kind
	Softirq  map[string]map[string]*float64 `json:"softirq_cpu_percent"` // sandbox -> kind: % of one CPU
	Ratios   map[string]map[string]*float64 `json:"ratios"`              // "copies"/"softirq" -> kind: sn / s1
	Status   map[string]string              `json:"status"`              // kind -> PASS / MISS / n/a
}

func newAmplification(rate int, dur time.Duration) *Amplification {
	a := &Amplification{Rate: rate, Seconds: dur.Seconds(),
		Messages: map[string]map[string]int64{}, Copies: map[string]map[string]*float64{},
		Softirq: map[string]map[string]*float64{}, Ratios: map[string]map[string]*float64{"copies": {}, "softirq": {}},
		Status: map[string]string{}}
	for _, s := range []string{"s1", "sn"} {
		a.Messages[s], a.Copies[s], a.Softirq[s] = map[string]int64{}, map[string]*float64{}, map[string]*float64{}
	}
	return a
}

// ampSender sends the crafted messages from a sandbox's client namespace.
type ampSender struct {
	frames *traffic.FrameSender
	icmp   *traffic.ICMPSender
	cmac   net.HardwareAddr
	hmac   net.HardwareAddr
}

func openAmpSender(sb *sandbox.Sandbox) (*ampSender, error) {
	s := &ampSender{hmac: sb.HostMAC}
	err := sb.Client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		s.cmac = ifi.HardwareAddr
		if s.frames, err = traffic.OpenFrameSender("eth0"); err != nil {
			return err
		}
		s.icmp, err = traffic.OpenICMPSender()
		return err
	})
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *ampSender) close() {
	if s.frames != nil {
		s.frames.Close()
	}
	if s.icmp != nil {
		s.icmp.Close()
	}
}

// send sends one message of kind.
func (s *ampSender) send(kind string, i int) error {
	host, client := sandbox.HostIP, sandbox.ClientIP
	switch {
	case isIdle(kind):
		return nil
	}
	switch kind {
	case ampARPOther:
		return s.frames.Send(traffic.ARPFrame(traffic.Broadcast, s.cmac, traffic.ARPRequest, client, nil, net.IPv4(198, 18, 0, byte(100+i%100))))
	case ampARPReply:
		return s.frames.Send(traffic.ARPFrame(s.hmac, s.cmac, traffic.ARPReply, client, s.hmac, host))
	case ampICMPError: // quotes a TCP flow from the static port of container 0
		return s.icmp.Send(host, traffic.ICMPError(3, 4, 1400, unix.IPPROTO_TCP, host, firstStatic, client, uint16(40000+i%1000)))
	case ampICMPHost: // the sandbox host's own ports (61000-61999) belong to no container
		return s.icmp.Send(host, traffic.ICMPError(3, 4, 1400, unix.IPPROTO_TCP, host, 61000+uint16(i%1000), client, 80))
	case ampEchoOwned:
		return s.icmp.Send(host, traffic.EchoReply(firstStatic, uint16(i)))
	case ampEchoOther: // an identifier in no container's ports (as a ping socket's usually is)
		return s.icmp.Send(host, traffic.EchoReply(60000, uint16(i)))
	}
	return fmt.Errorf("unknown kind %q", kind)
}

// vethTx sums the tx packets of the host ends of the containers' veths and
// reads host eth0's rx packets.
func vethTx(h *netlink.Handle) (tx, eth0rx int64, err error) {
	ls, err := h.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return 0, 0, err
	}
	for _, l := range ls {
		a := l.Attrs()
		if a.Statistics == nil {
			continue
		}
		switch {
		case strings.HasPrefix(a.Name, plane.VethPrefix):
			tx += int64(a.Statistics.TxPackets)
		case a.Name == "eth0":
			eth0rx = int64(a.Statistics.RxPackets)
		}
	}
	return tx, eth0rx, nil
}

// softirqTicks is the softirq time of all CPUs in USER_HZ ticks (/proc/stat).
func softirqTicks() (int64, error) {
	t, err := cpuTicks()
	if err != nil {
		return 0, err
	}
	return t[6], nil
}

const userHZ = 100 // USER_HZ of /proc/stat on Linux

// phaseAmplification measures every kind in S1 and SN.
func (b *bench) phaseAmplification(ctx context.Context) error {
	rate, dur := 2000, 2*time.Second
	if b.o.quick {
		dur = 500 * time.Millisecond
	}
	a := newAmplification(rate, dur)
	b.res.Amplification = a
	if b.targets[caseB] == nil || b.d1 == nil || b.dN == nil {
		return errors.New("needs S1 with its container and SN with N containers")
	}
	// S1 and SN measured back to back for each kind, so that both see the
	// same background load as far as possible.
	sbs := []struct {
		name string
		sb   *sandbox.Sandbox
		s    *ampSender
		h    *netlink.Handle
	}{{name: "s1", sb: b.sb1}, {name: "sn", sb: b.sbN}}
	for i := range sbs {
		var err error
		if sbs[i].s, err = openAmpSender(sbs[i].sb); err != nil {
			return err
		}
		defer sbs[i].s.close()
		if sbs[i].h, err = sbs[i].sb.Host.Netlink(); err != nil {
			return err
		}
		defer sbs[i].h.Close()
	}
	for _, kind := range ampKinds {
		for _, x := range sbs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := a.measure(x.name, x.s, x.h, kind, rate, dur); err != nil {
				return fmt.Errorf("%s: %w", x.name, err)
			}
		}
	}
	a.evaluate()
	for _, k := range ampKinds {
		b.logf("amplification %s: copies/msg %s (1) %s (N), softirq %s%% / %s%%: %s", k,
			fmtF(a.Copies["s1"][k]), fmtF(a.Copies["sn"][k]), fmtF(a.Softirq["s1"][k]), fmtF(a.Softirq["sn"][k]), a.Status[k])
	}
	return nil
}

// measure sends kind from s at rate for dur and records the copies and
// the softirq time in sandbox name (host handle h).
func (a *Amplification) measure(name string, s *ampSender, h *netlink.Handle, kind string, rate int, dur time.Duration) error {
	tx0, rx0, err := vethTx(h)
	if err != nil {
		return err
	}
	si0, err := softirqTicks()
	if err != nil {
		return err
	}
	t0 := time.Now()
	total := int(float64(rate) * dur.Seconds())
	sent := 0
	for sent < total {
		due := int(time.Since(t0).Seconds() * float64(rate))
		for ; sent < due && sent < total; sent++ {
			if err := s.send(kind, sent); err != nil {
				return fmt.Errorf("%s: send: %w", kind, err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	// the copies are delivered in the softirq of each message's
	// arrival: wait until the host has them all (bounded)
	var rx int64
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, rx, err = vethTx(h)
		if err != nil {
			return err
		}
		if rx-rx0 >= int64(total) || isIdle(kind) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	si1, err := softirqTicks()
	if err != nil {
		return err
	}
	tx1, _, err := vethTx(h)
	if err != nil {
		return err
	}
	got := rx - rx0
	a.Messages[name][kind] = got
	if got > 0 && !isIdle(kind) {
		a.Copies[name][kind] = ptr(float64(tx1-tx0) / float64(got))
	}
	a.Softirq[name][kind] = ptr(float64(si1-si0) / userHZ / elapsed.Seconds() * 100)
	return nil
}

// ampRatio is sn/s1 with 0/0 = 1 (nil: not measurable, s1 = 0 < sn).
func ampRatio(s1, sn *float64) *float64 {
	switch {
	case s1 == nil || sn == nil:
		return nil
	case *s1 == 0 && *sn == 0:
		return ptr(1.0)
	case *s1 == 0:
		return nil
	}
	return ptr(*sn / *s1)
}

func (a *Amplification) evaluate() {
	for _, k := range ampKinds {
		if isIdle(k) {
			a.Ratios["softirq"][k] = ampRatio(a.Softirq["s1"][k], a.Softirq["sn"][k])
			a.Status[k] = "baseline"
			continue
		}
		c1, cn := a.Copies["s1"][k], a.Copies["sn"][k]
		a.Ratios["copies"][k] = ampRatio(c1, cn)
		a.Ratios["softirq"][k] = ampRatio(a.Softirq["s1"][k], a.Softirq["sn"][k])
		r := a.Ratios["copies"][k]
		if c1 == nil || cn == nil || r == nil {
			a.Status[k] = "n/a"
			continue
		}
		ok := *r <= 1.3
		if want := ampTargetCopies[k]; want >= 0 {
			ok = ok && math.Abs(*cn-want) < 0.05 && math.Abs(*c1-want) < 0.05
		}
		a.Status[k] = map[bool]string{true: "PASS", false: "MISS"}[ok]
	}
}

func fmtF(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
}

func (a *Amplification) writeMarkdown(w io.Writer, n int) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "\n## ARP and ICMP amplification\n\n")
	fmt.Fprintf(w, "Each kind sent from the client at %d/s for %.1f s; copies = packets delivered to containers' veths per message the host received; softirq = the machine's softirq time while sending, %% of one CPU (machine-wide: other work adds to it; idle rows, sending nothing, before and after, are the baseline). Status: copies per message on target at 1 and N and flat (N/1 <= 1.3); softirq ratios are reported, not judged (machine-wide noise).\n\n", a.Rate, a.Seconds)
	fmt.Fprintf(w, "| kind | target copies | copies (1) | copies (%d) | ratio | softirq %% (1) | softirq %% (%d) | ratio | status |\n|---|---|---|---|---|---|---|---|---|\n", n, n)
	for _, k := range ampKinds {
		want := "flat"
		if isIdle(k) {
			want = "-"
		} else if t := ampTargetCopies[k]; t >= 0 {
			want = strconv.FormatFloat(t, 'f', 0, 64)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", k, want,
			fmtF(a.Copies["s1"][k]), fmtF(a.Copies["sn"][k]), fmtF(a.Ratios["copies"][k]),
			fmtF(a.Softirq["s1"][k]), fmtF(a.Softirq["sn"][k]), fmtF(a.Ratios["softirq"][k]), a.Status[k])
	}
}
