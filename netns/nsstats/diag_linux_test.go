package nsstats

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/tcfilter/nlbatch/nlattr"
)

func TestSplitMessagesAndAttr(t *testing.T) {
	ne := binary.NativeEndian
	msg := func(typ uint16, seq uint32, payload []byte) []byte {
		l := unix.NLMSG_HDRLEN + len(payload)
		b := make([]byte, (l+3)&^3)
		ne.PutUint32(b[0:], uint32(l))
		ne.PutUint16(b[4:], typ)
		ne.PutUint32(b[8:], seq)
		copy(b[unix.NLMSG_HDRLEN:], payload)
		return b
	}
	rta := func(typ uint16, payload []byte) []byte {
		l := unix.SizeofRtAttr + len(payload)
		b := make([]byte, (l+3)&^3)
		ne.PutUint16(b[0:], uint16(l))
		ne.PutUint16(b[2:], typ)
		copy(b[unix.SizeofRtAttr:], payload)
		return b
	}
	attrs := append(rta(1, []byte{1, 2, 3}), rta(inetDiagInfo, []byte{9, 8, 7, 6, 5})...)
	dgram := append(msg(unix.SOCK_DIAG_BY_FAMILY, 7, attrs), msg(unix.NLMSG_DONE, 7, []byte{0, 0, 0, 0})...)
	ms, err := splitMessages(dgram)
	if err != nil || len(ms) != 2 {
		t.Fatalf("split: %d messages, %v", len(ms), err)
	}
	if ms[0].typ != unix.SOCK_DIAG_BY_FAMILY || ms[0].seq != 7 || ms[1].typ != unix.NLMSG_DONE {
		t.Errorf("messages: %+v", ms)
	}
	if got := nlattr.Get(ms[0].data, inetDiagInfo); string(got) != string([]byte{9, 8, 7, 6, 5}) {
		t.Errorf("attr INFO = %v", got)
	}
	if got := nlattr.Get(ms[0].data, 3); got != nil {
		t.Errorf("absent attr = %v", got)
	}
	// A length running past the buffer is refused, not read.
	bad := msg(unix.NLMSG_DONE, 1, nil)
	ne.PutUint32(bad[0:], 4096)
	if _, err := splitMessages(bad); err == nil {
		t.Errorf("oversized message length accepted")
	}
	badAttr := rta(inetDiagInfo, []byte{1, 2, 3, 4})
	ne.PutUint16(badAttr[0:], 200)
	if got := nlattr.Get(badAttr, inetDiagInfo); got != nil {
		t.Errorf("oversized attribute returned %v", got)
	}
}

func TestCollectRejectsBadPaths(t *testing.T) {
	if _, err := Collect(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing path: %v", err)
	}
	// A regular file is not a network namespace: setns refuses it.
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(f); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("regular file: %v", err)
	}
}
