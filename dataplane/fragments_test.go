package dataplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
)

// bigMsg is a single-line message of n bytes whose content depends on
// its size and a tag (a reply from a mixed-up reassembly cannot match).
func bigMsg(tag string, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(tag)
		b.WriteByte('-')
	}
	return b.String()[:n]
}

// mustEchoBig sends msg as one datagram from ns and wants the whole of it
// back from server want (the echo servers answer "<name> <msg>").
func mustEchoBig(t testing.TB, ns doer, network, addr, want, msg string) {
	t.Helper()
	var reply string
	err := ns.Do(func() (err error) {
		reply, err = traffic.Echo(context.Background(), network, addr, msg, traffic.WithTimeout(3*time.Second))
		return err
	})
	switch {
	case err != nil:
		t.Errorf("%s %s, %d bytes: %v (want the reply of %s)", network, addr, len(msg), err, want)
	case reply != want+" "+msg:
		t.Errorf("%s %s, %d bytes: reply of %d bytes starting %.40q, want %s's echo of the message", network, addr, len(msg), len(reply), reply, want)
	}
}

// fragSizes are the datagram sizes the fragment tests send: a few
// fragments, and as many as a UDP datagram can have.
var fragSizes = []int{4000, 65000}

// TestFragmentsFromOutside: datagrams larger than the MTU, sent by the
// client namespace to containers' ports over IPv4 and IPv6, reach their
// owner whole (the first fragment by its port, the later ones after it);
// one to a port nobody owns still reaches the host.
func TestFragmentsFromOutside(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	if e.d.frag == nil {
		t.Fatal("fragment steering is off: the kernel could not run the programs")
	}
	e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	serveIn(t, e.sb.Host, "[::]:8000", "host")
	for _, n := range fragSizes {
		for _, fam := range []struct{ nw, a, b, h string }{
			{"udp4", hostAddr(31000), hostAddr(31010), hostAddr(8000)},
			{"udp6", host6Addr(e, 31000), host6Addr(e, 31010), host6Addr(e, 8000)},
		} {
			mustEchoBig(t, e.sb.Client, fam.nw, fam.a, "A", bigMsg("a", n))
			mustEchoBig(t, e.sb.Client, fam.nw, fam.b, "B", bigMsg("b", n))
			mustEchoBig(t, e.sb.Client, fam.nw, fam.h, "host", bigMsg("h", n))
		}
	}
	st, err := e.d.Fragments()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fragments: %+v", st)
	if st.Steered4 == 0 || st.Steered6 == 0 || st.Learned == 0 {
		t.Errorf("counters say nothing was steered: %+v", st)
	}
}

// TestFragmentsAcrossRestart: with the data plane gone the attached
// programs keep steering; a restarted one keeps the tables (and their
// counters) and re-attaches its programs to eth0, lo and an adopted
// container's veth.
func TestFragmentsAcrossRestart(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	check := func(when string) {
		t.Helper()
		for _, addr := range []string{hostAddr(31000), host6Addr(e, 31000)} {
			mustEchoBig(t, e.sb.Client, "udp", addr, "A", bigMsg(when, 4000))
		}
	}
	check("running")
	before := fragStats(t, e)
	e.d.Close()
	check("gone")
	ctx := context.Background()
	d2 := e.newDataPlane()
	if _, err := d2.PrepareHost(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d2.Adopt(ctx, a.c); err != nil {
		t.Fatal(err)
	}
	e.d = d2
	check("adopted")
	after := fragStats(t, e)
	if !after.Adopted {
		t.Error("the restarted data plane did not keep the fragment tables")
	}
	// the same build: the adopted veth's learn program is kept, not put
	// there again, and the "adopted" datagrams above were steered with it
	if d2.frag == nil || !d2.frag.Kept() {
		t.Error("a restart of the same build did not keep the attached programs")
	}
	// running: 2 datagrams of 3 fragments, gone and adopted: 2 more each
	if got, want := after.Steered()-before.Steered(), uint64(8); got != want {
		t.Errorf("fragments steered across the restart: %d, want %d (%+v, then %+v)", got, want, before, after)
	}
	if !d2.frag.Attached(d2.ctrs[a.c.ID].veth, false) {
		t.Error("no learn program on the adopted container's veth")
	}
}

// TestFragmentsBetweenContainers: a container's datagrams larger than
// the MTU to another container's port and to its own ports through the
// host IP and a host IPv6 address arrive whole: with the wire guard the
// container's lo and host veth have the loopback MTU, so they cross the
// host's lo unfragmented (docs/fragments.md, "The lo path"); fragment
// steering has nothing to do there.
func TestFragmentsBetweenContainers(t *testing.T) {
	checkRootUnchanged(t)
	e := steeredEnv6(t)
	a := e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	b := e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	for _, n := range fragSizes {
		msg := bigMsg("between", n)
		for _, c := range []struct {
			from doer
			addr string
			want string
		}{
			{b.proc, hostAddr(31000), "A"},
			{b.proc, host6Addr(e, 31000), "A"},
			{a.proc, hostAddr(31010), "B"},
			{a.proc, host6Addr(e, 31010), "B"},
			{a.proc, hostAddr(31000), "A"},
			{a.proc, host6Addr(e, 31000), "A"},
		} {
			mustEchoBig(t, c.from, "udp", c.addr, c.want, msg)
		}
	}
	// unfragmented traffic to its own port stays inside (as before)
	for _, nw := range []string{"udp", "tcp"} {
		mustEcho(t, a.proc, nw, hostAddr(31000), "A")
		mustEcho(t, a.proc, nw, loAddr(31000), "A")
		mustEcho(t, a.proc, nw, host6Addr(e, 31000), "A")
		mustEcho(t, a.proc, nw, lo6Addr(31000), "A")
		mustEcho(t, b.proc, nw, lo6Addr(31000), "A")
	}
}
