package traffic

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

// PingInterval is the pause after each answered echo request, during which
// duplicate replies to it are still counted.
var PingInterval = 100 * time.Millisecond

// PingResult counts ICMP echo replies per request.
type PingResult struct {
	Sent       int   `json:"sent"`
	Replies    int   `json:"replies"`    // all matching replies, duplicates included
	Answered   int   `json:"answered"`   // requests with at least one reply
	Duplicates int   `json:"duplicates"` // replies beyond the first for a request
	PerSeq     []int `json:"per_seq"`    // PerSeq[i]: replies to sequence number i+1
}

// ExactlyOnce reports whether every request got exactly one reply.
func (r PingResult) ExactlyOnce() bool {
	for _, n := range r.PerSeq {
		if n != 1 {
			return false
		}
	}
	return len(r.PerSeq) > 0
}

// Ping sends count ICMP echo requests to dst (IPv4, or IPv6: ICMPv6 echo)
// from a raw socket in the
// calling thread's network namespace (needs root) and returns how many echo
// replies came back, duplicates included. See PingStats.
func Ping(ctx context.Context, dst net.IP, count int, timeout time.Duration) (int, error) {
	r, err := PingStats(ctx, dst, count, timeout)
	return r.Replies, err
}

// PingStats sends count echo requests to dst one after the other: each waits
// up to timeout for its reply, then PingInterval more to catch duplicates.
// Replies are matched by source, identifier (random per call) and sequence
// number. Losing replies is not an error; failing to send is.
func PingStats(ctx context.Context, dst net.IP, count int, timeout time.Duration) (PingResult, error) {
	res := PingResult{PerSeq: make([]int, max(count, 0))}
	fam, err := pingFamilyOf(dst)
	if err != nil {
		return res, err
	}
	if count <= 0 || count > 10000 {
		return res, fmt.Errorf("ping: count %d out of range 1..10000", count)
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	c, err := net.ListenPacket(fam.network, fam.any)
	if err != nil {
		return res, fmt.Errorf("ping: raw %s socket (needs root): %w", fam.network, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var idb [2]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])

	buf := make([]byte, 1500)
	// collect reads replies until the deadline; it returns early (true) once
	// wantSeq has a reply, if wantSeq > 0.
	collect := func(deadline time.Time, wantSeq int) error {
		for {
			if wantSeq > 0 && res.PerSeq[wantSeq-1] > 0 {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if !time.Now().Before(deadline) {
				return nil
			}
			c.SetReadDeadline(deadline)
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					continue
				}
				return err
			}
			ipa, ok := from.(*net.IPAddr)
			if !ok || !ipa.IP.Equal(fam.dst) || n < 8 {
				continue
			}
			m := buf[:n]
			if m[0] != fam.reply || m[1] != 0 || binary.BigEndian.Uint16(m[4:]) != id {
				continue // not an echo reply to us
			}
			seq := int(binary.BigEndian.Uint16(m[6:]))
			if seq < 1 || seq > count {
				continue
			}
			res.PerSeq[seq-1]++
		}
	}

	for seq := 1; seq <= count; seq++ {
		msg := fam.request(id, uint16(seq))
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: fam.dst}); err != nil {
			return res.tally(), fmt.Errorf("ping: send seq %d to %v: %w", seq, fam.dst, err)
		}
		res.Sent++
		if err := collect(time.Now().Add(timeout), seq); err != nil {
			return res.tally(), fmt.Errorf("ping: %w", err)
		}
		if err := collect(time.Now().Add(PingInterval), 0); err != nil {
			return res.tally(), fmt.Errorf("ping: %w", err)
		}
	}
	return res.tally(), nil
}

func (r PingResult) tally() PingResult {
	r.Replies, r.Answered, r.Duplicates = 0, 0, 0
	for _, n := range r.PerSeq {
		r.Replies += n
		if n > 0 {
			r.Answered++
			r.Duplicates += n - 1
		}
	}
	return r
}

// echoRequest builds an ICMP echo request with a 16-byte payload.
func echoRequest(id, seq uint16) []byte {
	m := echoMessage(8, id, seq) // echo request
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return m
}

// echoMessage is an ICMP or ICMPv6 echo message of type typ without its
// checksum.
func echoMessage(typ byte, id, seq uint16) []byte {
	m := make([]byte, 8+16)
	m[0] = typ
	binary.BigEndian.PutUint16(m[4:], id)
	binary.BigEndian.PutUint16(m[6:], seq)
	copy(m[8:], "isotraffic-ping!")
	return m
}

// Checksum is the Internet checksum (RFC 1071).
func Checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
