package neighsync

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestServeFailedAttachNotCounted: an Add whose filter could not be
// attached (the member is not served) leaves the served set as it was, so
// that the next Add of the same ifindex attaches the filter with it.
func TestServeFailedAttachNotCounted(t *testing.T) {
	r := &receiver{all: sock{fd: -1}, served: map[int]int{}}
	if err := r.serve(2, true); err == nil {
		t.Fatal("a filter attached to no socket")
	}
	if len(r.served) != 0 {
		t.Fatalf("after a failed attach: served %v, want none", r.served)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	r.all.fd = fd
	if err := r.serve(2, true); err != nil {
		t.Fatal(err)
	}
	if r.served[2] != 1 {
		t.Fatalf("served %v, want ifindex 2 once", r.served)
	}
}
