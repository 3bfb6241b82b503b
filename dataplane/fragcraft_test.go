package dataplane

import (
	"encoding/binary"
	"net"

	"github.com/isolatord/isolatord/test/traffic"
)

// Crafted fragment trains: a UDP datagram cut into Ethernet frames by
// hand, so tests can send fragments in any order and interleave trains.

// fragTrain returns the frames of one UDP datagram src:sport -> dst:dport
// carrying payload, cut into fragments of at most mtu bytes (IPv4 or IPv6
// by the addresses' family), with identification id; frame 0 is the
// first fragment.
func fragTrain(dstMAC, srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16, id uint32, payload []byte, mtu int) [][]byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	v4 := src.To4() != nil
	binary.BigEndian.PutUint16(udp[6:], udpChecksum(src, dst, udp))
	hdr := 20
	ethType := uint16(0x0800)
	if !v4 {
		hdr, ethType = 48, 0x86dd
	}
	chunk := (mtu - hdr) &^ 7
	var frames [][]byte
	for off := 0; off < len(udp); off += chunk {
		end := min(off+chunk, len(udp))
		more := end < len(udp)
		f := make([]byte, 14+hdr+end-off)
		copy(f[0:], dstMAC)
		copy(f[6:], srcMAC)
		binary.BigEndian.PutUint16(f[12:], ethType)
		ip := f[14:]
		if v4 {
			ip[0] = 0x45
			binary.BigEndian.PutUint16(ip[2:], uint16(hdr+end-off))
			binary.BigEndian.PutUint16(ip[4:], uint16(id))
			fo := uint16(off / 8)
			if more {
				fo |= 0x2000
			}
			binary.BigEndian.PutUint16(ip[6:], fo)
			ip[8], ip[9] = 64, 17
			copy(ip[12:], src.To4())
			copy(ip[16:], dst.To4())
			binary.BigEndian.PutUint16(ip[10:], traffic.Checksum(ip[:20]))
		} else {
			ip[0] = 0x60
			binary.BigEndian.PutUint16(ip[4:], uint16(8+end-off))
			ip[6], ip[7] = 44, 64
			copy(ip[8:], src.To16())
			copy(ip[24:], dst.To16())
			ip[40] = 17
			fo := uint16(off)
			if more {
				fo |= 1
			}
			binary.BigEndian.PutUint16(ip[42:], fo)
			binary.BigEndian.PutUint32(ip[44:], id)
		}
		copy(ip[hdr:], udp[off:end])
		frames = append(frames, f)
	}
	return frames
}

// udpChecksum is the UDP checksum of segment udp (its checksum field 0)
// with the pseudo-header of src and dst.
func udpChecksum(src, dst net.IP, udp []byte) uint16 {
	var ph []byte
	if s4, d4 := src.To4(), dst.To4(); s4 != nil && d4 != nil {
		ph = append(append(append([]byte{}, s4...), d4...), 0, 17, byte(len(udp)>>8), byte(len(udp)))
	} else {
		ph = append(append([]byte{}, src.To16()...), dst.To16()...)
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(udp)))
		ph = append(ph, 0, 0, 0, 17)
	}
	c := traffic.Checksum(append(ph, udp...))
	if c == 0 {
		c = 0xffff
	}
	return c
}
