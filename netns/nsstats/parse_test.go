package nsstats

import (
	"testing"
	"time"
)

// snmpSample is /proc/net/snmp of a 6.18 kernel.
const snmpSample = `Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 2 64 274063 0 0 0 0 0 274063 265157 0 0 0 0 0 0 0 0 0 265157
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors OutRateLimitGlobal OutRateLimitHost OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps
Icmp: 101 0 0 1 0 0 0 0 50 50 0 0 0 0 100 0 0 0 0 0 0 0 0 50 50 0 0 0 0
IcmpMsg: InType0 InType3 InType8 OutType0 OutType8
IcmpMsg: 50 1 50 50 50
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 4748 4696 14 0 0 171598 171194 12 0 16 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 102353 0 0 102365 0 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
`

func TestParseSNMP(t *testing.T) {
	m, err := parseSNMP([]byte(snmpSample))
	if err != nil {
		t.Fatal(err)
	}
	for group, n := range map[string]int{"Ip": 20, "Icmp": 29, "IcmpMsg": 5, "Tcp": 14, "Udp": 9, "UdpLite": 9} {
		if len(m[group]) != n {
			t.Errorf("%s: %d counters, want %d: %v", group, len(m[group]), n, m[group])
		}
	}
	for _, c := range []struct {
		group, name string
		want        uint64
	}{
		{"Ip", "InReceives", 274063}, {"Ip", "OutTransmits", 265157}, {"Ip", "Forwarding", 2},
		{"Icmp", "InEchos", 50}, {"Icmp", "OutMsgs", 100},
		{"Tcp", "ActiveOpens", 4748}, {"Tcp", "RetransSegs", 12}, {"Tcp", "OutRsts", 16},
		{"Udp", "InDatagrams", 102353}, {"Udp", "OutDatagrams", 102365},
	} {
		if v, ok := m[c.group][c.name]; !ok || v != c.want {
			t.Errorf("%s.%s = %d (present %v), want %d", c.group, c.name, v, ok, c.want)
		}
	}
	if _, ok := m["Tcp"]["MaxConn"]; ok {
		t.Errorf("Tcp.MaxConn (-1) should be left out")
	}
}

func TestParseSNMPRejectsMalformed(t *testing.T) {
	for name, in := range map[string]string{
		"count mismatch": "Tcp: A B C\nTcp: 1 2\n",
		"not a number":   "Udp: A B\nUdp: 1 x\n",
		"no values":      "Ip: A B\n",
		"no colon":       "Ip A B\nIp 1 2\n",
		"huge negative":  "Ip: A\nIp: -99999999999999999999\n",
	} {
		if _, err := parseSNMP([]byte(in)); err == nil {
			t.Errorf("%s: no error for %q", name, in)
		}
	}
}

func TestParseSockstat(t *testing.T) {
	in := "sockets: used 13\nTCP: inuse 7 orphan 1 tw 965 alloc 8 mem 382\nUDP: inuse 0 mem 0\n"
	m, err := parseSockstat([]byte(in), "TCP")
	if err != nil {
		t.Fatal(err)
	}
	if m["inuse"] != 7 || m["tw"] != 965 || m["orphan"] != 1 || m["alloc"] != 8 || m["mem"] != 382 {
		t.Errorf("TCP = %v", m)
	}
	m6, err := parseSockstat([]byte("TCP6: inuse 4\nUDP6: inuse 1\n"), "TCP6")
	if err != nil || m6["inuse"] != 4 {
		t.Errorf("TCP6 = %v, %v", m6, err)
	}
	if _, err := parseSockstat([]byte("UDP: inuse 0 mem 0\n"), "TCP"); err == nil {
		t.Errorf("missing TCP line: no error")
	}
	if _, err := parseSockstat([]byte("TCP: inuse 7 orphan\n"), "TCP"); err == nil {
		t.Errorf("odd TCP line: no error")
	}
	if _, err := parseSockstat([]byte("TCP: inuse -1\n"), "TCP"); err == nil {
		t.Errorf("negative inuse: no error")
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	if percentiles(nil) != nil || percentiles([]uint32{0, 0}) != nil {
		t.Fatalf("percentiles of no non-zero sample should be nil")
	}
	us := func(n uint32) time.Duration { return time.Duration(n) * time.Microsecond }
	// 1..100 in reverse, with zeros (no sample yet) mixed in.
	var v []uint32
	for i := uint32(100); i >= 1; i-- {
		v = append(v, i, 0)
	}
	r := percentiles(v)
	if r.Samples != 100 || r.P50 != us(50) || r.P90 != us(90) || r.P95 != us(95) || r.P99 != us(99) {
		t.Errorf("1..100: %+v", *r)
	}
	r = percentiles([]uint32{42})
	if r.Samples != 1 || r.P50 != us(42) || r.P99 != us(42) {
		t.Errorf("one sample: %+v", *r)
	}
	// Nearest rank over 4 values: p50 -> 2nd, p90/p95/p99 -> 4th.
	r = percentiles([]uint32{400, 100, 300, 200})
	if r.P50 != us(200) || r.P90 != us(400) || r.P95 != us(400) || r.P99 != us(400) {
		t.Errorf("4 samples: %+v", *r)
	}
	// 10 values: p90 -> 9th, p95 and p99 -> 10th.
	r = percentiles([]uint32{10, 20, 30, 40, 50, 60, 70, 80, 90, 100})
	if r.P50 != us(50) || r.P90 != us(90) || r.P95 != us(100) || r.P99 != us(100) {
		t.Errorf("10 samples: %+v", *r)
	}
}
