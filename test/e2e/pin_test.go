package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/test/sandbox"
)

// TestRuntimePinAtSamePath is Nomad's case: the runtime pins the alloc's
// namespace at <netns-dir>/<id> itself and passes that id to CNI. isolatord
// uses that pin (pin_owned false, shown by isolatorctl), and neither DEL,
// nor a DEL after an isolatord restart, unmounts it.
func TestRuntimePinAtSamePath(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	nw := newCNINet(t, Binaries(t), d.Socket, "isolator", "1.0.0", "")
	ctx := cniCtx(t)
	web := startServer(t, sb, "web", 31001)
	id := sb.Name + "-alloc"
	theirs := pinAt(t, web.NetNS, d.NetNSDir, id) // what Nomad does
	rt := cniRuntime(id, theirs, cniPortMappings(31001))
	if _, err := nw.CNI.AddNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("ADD: %v\n%s", err, d.Log())
	}
	mustEcho(t, sb, "tcp", 31001, "web")
	var got struct {
		Netns    string `json:"netns"`
		PinOwned bool   `json:"pin_owned"`
	}
	if err := json.Unmarshal([]byte(d.Ctl(t, "-o", "json", "get", id)), &got); err != nil {
		t.Fatal(err)
	}
	if got.Netns != theirs || got.PinOwned {
		t.Errorf("get %s: netns %s pin_owned %v, want the runtime's %s, not owned", id, got.Netns, got.PinOwned, theirs)
	}
	if out := d.Ctl(t, "get", id); !strings.Contains(out, "the runtime's pin") {
		t.Errorf("get does not say the pin is the runtime's:\n%s", out)
	}

	// Restarted, isolatord still knows the pin is not its own.
	d.Kill()
	d.Start()
	mustEcho(t, sb, "tcp", 31001, "web")
	if err := nw.CNI.DelNetworkList(ctx, nw.List, rt); err != nil {
		t.Fatalf("DEL: %v\n%s", err, d.Log())
	}
	if c := cniGet(t, d, id); c != nil {
		t.Fatalf("DEL left %s", id)
	}
	ns, err := nshandle.Open(theirs)
	if err != nil {
		t.Fatalf("DEL removed the runtime's pin %s: %v", theirs, err)
	}
	ns.Close()
	if _, err := echoFromClient(sb, "tcp", 31001); err == nil {
		t.Error("traffic still reaches the container after DEL")
	}
}
