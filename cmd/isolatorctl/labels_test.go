package main

import (
	"strings"
	"testing"
)

// TestLabels: get shows a container's labels (table and JSON), list -o
// json carries them, list --label keeps the containers carrying all the
// given labels, and a malformed --label is a usage error.
func TestLabels(t *testing.T) {
	sock, fake := startFake(t)
	mustCtl(t, sock, "prepare", "web")
	mustCtl(t, sock, "prepare", "db")
	mustCtl(t, sock, "prepare", "bare")
	fake.mu.Lock()
	fake.containers["web"].Labels = map[string]string{"cni.network": "isolator", "cni.ifname": "eth0", "K8S_POD_NAME": "web-0"}
	fake.containers["db"].Labels = map[string]string{"cni.network": "other", "cni.ifname": "eth0"}
	fake.mu.Unlock()

	out := mustCtl(t, sock, "get", "web")
	if got, want := tableValue(t, out, "Labels"), "K8S_POD_NAME=web-0, cni.ifname=eth0, cni.network=isolator"; got != want {
		t.Errorf("Labels: %q, want %q\n%s", got, want, out)
	}
	if got := tableValue(t, mustCtl(t, sock, "get", "bare"), "Labels"); got != "-" {
		t.Errorf("Labels of a container without any: %q, want -", got)
	}
	js := decodeJSON[containerJSON](t, mustCtl(t, sock, "get", "web", "-o", "json"))
	if js.Labels["K8S_POD_NAME"] != "web-0" || len(js.Labels) != 3 {
		t.Errorf("get -o json labels = %v", js.Labels)
	}

	ids := func(args ...string) string {
		var got []string
		for _, c := range decodeJSON[[]containerJSON](t, mustCtl(t, sock, append([]string{"list", "-o", "json"}, args...)...)) {
			if c.Labels == nil {
				t.Errorf("list -o json: %s has labels null, want {}", c.ContainerID)
			}
			got = append(got, c.ContainerID)
		}
		return strings.Join(got, ",")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "bare,db,web"},
		{[]string{"--label", "cni.network=isolator"}, "web"},
		{[]string{"--label", "cni.ifname=eth0"}, "db,web"},
		{[]string{"--label", "cni.ifname=eth0", "--label", "cni.network=other"}, "db"},
		{[]string{"--label", "cni.network="}, ""},
		{[]string{"--label", "nope=x"}, ""},
	} {
		if got := ids(c.args...); got != c.want {
			t.Errorf("list %v = %q, want %q", c.args, got, c.want)
		}
	}
	if out := mustCtl(t, sock, "list", "--label", "cni.network=isolator"); !strings.Contains(out, "web") || strings.Contains(out, "db") {
		t.Errorf("list --label table:\n%s", out)
	}
	for _, bad := range []string{"novalue", "=x"} {
		_, errOut, code := ctl("--socket", sock, "list", "--label", bad)
		if code != exitUsage || !strings.Contains(errOut, "KEY=VALUE") {
			t.Errorf("list --label %s: exit %d, stderr %q", bad, code, errOut)
		}
	}
}
