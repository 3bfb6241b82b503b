package nspin

import (
	"testing"
)

func TestParseMountInfo(t *testing.T) {
	m, ok := parseMountInfoLine(`36 35 98:0 net:[4026532] /run/netns/a\040b rw shared:5 master:1 - nsfs nsfs rw`)
	if !ok || m.ID != 36 || m.Parent != 35 || m.Root != "net:[4026532]" || m.MountPoint != "/run/netns/a b" ||
		!m.Shared() || m.FSType != "nsfs" || len(m.Optional) != 2 {
		t.Fatalf("%+v %v", m, ok)
	}
	m, ok = parseMountInfoLine(`1 0 8:1 / / rw - ext4 /dev/sda1 rw`)
	if !ok || m.Shared() || len(m.Optional) != 0 || m.MountPoint != "/" {
		t.Fatalf("%+v %v", m, ok)
	}
	if _, ok := parseMountInfoLine("garbage"); ok {
		t.Fatal("garbage parsed")
	}
}
