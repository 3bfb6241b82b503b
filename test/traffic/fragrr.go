package traffic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// FragRequestResponse runs request/response round trips over UDP to a
// ServeUDP server for dur: each request is one datagram of size bytes
// (beginning with ModeRR, so the server answers one byte), fragmented on
// the way when size exceeds the path's MTU. It returns round trips per
// second. A lost datagram (its request or its reply) costs a 200 ms
// wait; more than 10 losses is an error.
func FragRequestResponse(ctx context.Context, addr string, size int, dur time.Duration) (float64, error) {
	if size < 1 || size > 65507 {
		return 0, fmt.Errorf("frag rr: request size %d out of 1..65507", size)
	}
	ctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := make([]byte, size)
	req[0] = ModeRR
	in := make([]byte, 64)
	var n, lost int
	start := time.Now()
	end := start.Add(dur)
	for time.Now().Before(end) {
		if _, err := c.Write(req); err != nil {
			return 0, err
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(in); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
				if lost++; lost > 10 {
					return 0, fmt.Errorf("frag rr: %d datagrams of %d bytes lost: %w", lost, size, err)
				}
				continue
			}
			return 0, err
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
