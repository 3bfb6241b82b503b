package veth

import (
	"bytes"
	"net"
	"testing"

	"github.com/isolatord/isolatord/netns/nshandle/nstest"
)

var testMAC = net.HardwareAddr{0x02, 0x18, 0x00, 0x00, 0x00, 0x01}

func TestCreateDelete(t *testing.T) {
	host, ctr := nstest.Scratch(t), nstest.Scratch(t)
	hh, ch := nstest.Netlink(t, host), nstest.Netlink(t, ctr)

	idx, err := Create(hh, ctr, Spec{Name: "isotest0", PeerName: "eth0", MAC: testMAC, MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	hv, err := hh.LinkByIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	if hv.Attrs().Name != "isotest0" || !bytes.Equal(hv.Attrs().HardwareAddr, testMAC) || hv.Attrs().MTU != 1400 {
		t.Fatalf("host end: %+v", hv.Attrs())
	}
	pe, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatalf("peer not created inside the container: %v", err)
	}
	if !bytes.Equal(pe.Attrs().HardwareAddr, testMAC) || pe.Attrs().MTU != 1400 {
		t.Fatalf("peer: %+v", pe.Attrs())
	}
	if _, err := Create(hh, ctr, Spec{Name: "isotest0", PeerName: "eth1", MAC: testMAC}); err == nil {
		t.Fatal("second veth with the same name accepted")
	}
	if _, err := Create(hh, ctr, Spec{Name: "waytoolongname16", PeerName: "eth1", MAC: testMAC}); err == nil {
		t.Fatal("16-byte name accepted")
	}

	// Deleting the host end takes the peer with it.
	existed, err := Delete(hh, idx)
	if err != nil || !existed {
		t.Fatalf("Delete = %v %v", existed, err)
	}
	if _, err := ch.LinkByName("eth0"); err == nil {
		t.Fatal("peer survived the host end")
	}
	existed, err = Delete(hh, idx)
	if err != nil || existed {
		t.Fatalf("second Delete = %v %v", existed, err)
	}
	existed, err = DeleteByName(hh, "isotest0")
	if err != nil || existed {
		t.Fatalf("DeleteByName of a gone link = %v %v", existed, err)
	}
}
