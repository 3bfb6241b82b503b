package nshandle_test

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

const portRange = "/proc/sys/net/ipv4/ip_local_port_range"

func TestOpenIdentity(t *testing.T) {
	nstest.NeedRoot(t)
	self, err := nshandle.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	viaPid, err := nshandle.OpenPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer viaPid.Close()
	if !self.SameAs(viaPid) {
		t.Fatalf("Current %v and nshandle.OpenPid(self) %v differ", self, viaPid)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if self.Ino() != st.Ino {
		t.Fatalf("inode %d, stat says %d", self.Ino(), st.Ino)
	}
	s := nstest.Scratch(t)
	if s.SameAs(self) {
		t.Fatal("scratch namespace equals our own")
	}
	if _, err := nshandle.Open("/proc/self/ns/mnt"); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Fatalf("opening a mount namespace: %v", err)
	}
	if _, err := nshandle.Open("/etc/hostname"); err == nil {
		t.Fatal("opened a regular file as a namespace")
	}
	if _, err := nshandle.OpenPid(0); err == nil {
		t.Fatal("nshandle.OpenPid(0) succeeded")
	}
}

func TestDoSwitchesOnlyTheLockedThread(t *testing.T) {
	s := nstest.Scratch(t)
	self, err := nshandle.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	var inside uint64
	err = s.Do(func() error {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return err
		}
		inside = st.Ino
		return os.WriteFile(portRange, []byte("40000 40999"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != s.Ino() {
		t.Fatalf("inside Do the thread was in net:[%d], want net:[%d]", inside, s.Ino())
	}
	var got []byte
	if err := s.Do(func() (err error) { got, err = os.ReadFile(portRange); return err }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(strings.Fields(string(got)), " ") != "40000 40999" {
		t.Fatalf("scratch ip_local_port_range = %q", got)
	}
	root, err := os.ReadFile(portRange)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(strings.Fields(string(root)), " ") == "40000 40999" {
		t.Fatal("the write leaked into the process's namespace")
	}
	// Many goroutines after Do: none of them may find itself elsewhere.
	for i := 0; i < 50; i++ {
		if err := s.Do(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		now, err := nshandle.Current()
		if err != nil {
			t.Fatal(err)
		}
		same := now.SameAs(self)
		now.Close()
		if !same {
			t.Fatal("a goroutine ended up outside the process namespace after Do")
		}
	}
	if err := s.Do(func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("panic inside Do: %v", err)
	}
}
