// Package unarygrpc makes unary gRPC calls over HTTP/2 cleartext (h2c) on
// a unix socket, without net/http, crypto or grpc-go: what a short-lived
// client (a CNI plugin, a CLI) needs to ask a local gRPC server a few
// questions, at a fraction of grpc-go's start-up cost.
//
// Messages travel as bytes: the caller encodes the request and decodes the
// reply, so that neither protobuf's reflection nor grpc-go is linked.
//
// Dial does not wait for the server: the HTTP/2 preface and SETTINGS go out
// with the first call's HEADERS and DATA in one write, and the server's
// SETTINGS are read with the reply, so a call on a new connection costs
// one round trip. Until they are sent, the request follows HTTP/2's
// default settings (a 16 KiB frame, a 64 KiB window), as the protocol
// allows a client to.
//
// One call runs at a time on a Conn (calls from several goroutines wait
// for each other). Errors are *Error: the server's code and message
// (percent-decoded), DeadlineExceeded or Canceled when the context ends,
// Unavailable when the connection fails or the server goes away; and
// *HandshakeError when the server never greeted the connection. The client
// announces a 1 MiB flow-control window and replenishes it, so replies of
// any size up to MaxReplySize are read; it honours the server's windows
// when sending, and answers PING and SETTINGS.
package unarygrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2/hpack"
)

// MaxReplySize bounds a reply message (grpc-go's own client default is 4
// MiB; a list of many containers may exceed it).
const MaxReplySize = 64 << 20

// Conn is an HTTP/2 connection to a gRPC server.
type Conn struct {
	mu sync.Mutex
	nc net.Conn
	br *bufio.Reader
	// wbuf holds frames not yet written; flush writes them.
	wbuf []byte
	rbuf []byte
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	dec  *hpack.Decoder

	nextStream uint32
	// sendConn is the connection's send window; initSend the server's
	// initial stream window; maxFrame the server's largest frame.
	sendConn, initSend int64
	maxFrame           int
	// recvConn counts DATA bytes received since the last connection
	// WINDOW_UPDATE.
	recvConn int
	// lastStream is the server's GOAWAY last-stream-id (goAway set).
	goAway     bool
	lastStream uint32
	// broken is set when the connection can no longer be used.
	broken error
	// wfail is the error of a failed write: nothing more is written.
	wfail error

	// cur is the call in progress, which the header decoder fills.
	cur *call
	// gotSettings: the server's first SETTINGS arrived (its greeting);
	// greetBy is Dial's deadline for them (zero: none); greetLimited is
	// set while it bounds the call in progress, and liftGreetBy gives the
	// call back its own deadline once they are in.
	gotSettings  bool
	greetBy      time.Time
	greetLimited bool
	liftGreetBy  func()
}

// Dial connects to the unix socket at path and returns at once: the
// HTTP/2 preface and SETTINGS wait in the buffer for the first call. An
// error from connecting is returned as the net package gives it
// (errors.Is finds syscall.ENOENT, ECONNREFUSED, EACCES). ctx's deadline
// still bounds the wait for the server's greeting: a call that has not
// received it by then fails with a *HandshakeError wrapping
// context.DeadlineExceeded, as a dial that waited would have.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	c := &Conn{
		nc: nc, br: bufio.NewReaderSize(nc, 32<<10),
		nextStream: 1, sendConn: defaultWindow, initSend: defaultWindow, maxFrame: defaultMaxFrame,
	}
	c.greetBy, _ = ctx.Deadline()
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.dec = hpack.NewDecoder(4096, c.emit)
	c.dec.SetMaxStringLength(MaxReplySize)

	c.wbuf = append(c.wbuf, preface...)
	var s []byte
	for _, kv := range [][2]uint32{{settingEnablePush, 0}, {settingInitialWindowSize, ourWindow}, {settingMaxFrameSize, ourMaxFrame}} {
		s = binary.BigEndian.AppendUint16(s, uint16(kv[0]))
		s = binary.BigEndian.AppendUint32(s, kv[1])
	}
	c.wbuf = appendFrame(c.wbuf, frameSettings, 0, 0, s)
	c.wbuf = appendWindowUpdate(c.wbuf, 0, ourWindow-defaultWindow)
	return c, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// watch applies the call's deadline to the socket (ctx's, or Dial's
// deadline for the greeting when that is earlier and the greeting has not
// arrived), and ends blocked reads and writes when ctx is cancelled. lift
// drops the greeting's deadline; stop undoes it all.
func (c *Conn) watch(ctx context.Context) (lift, stop func()) {
	d, _ := ctx.Deadline()
	first := d
	if !c.gotSettings && !c.greetBy.IsZero() && (d.IsZero() || c.greetBy.Before(d)) {
		first = c.greetBy
	}
	var mu sync.Mutex
	ended := false
	set := func(t time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			c.nc.SetDeadline(t)
		}
	}
	set(first)
	c.greetLimited = !first.Equal(d)
	fired := make(chan struct{})
	after := context.AfterFunc(ctx, func() {
		mu.Lock()
		ended = true
		c.nc.SetDeadline(time.Unix(1, 0))
		mu.Unlock()
		close(fired)
	})
	lift = func() {
		if c.greetLimited {
			c.greetLimited = false
			set(d)
		}
	}
	stop = func() {
		if !after() {
			<-fired // let it finish before the deadline is cleared
		}
		c.nc.SetDeadline(time.Time{})
	}
	return lift, stop
}

// ioError is the error for a failed read or write during what: the
// context's end if it ended; before the server's greeting, a
// *HandshakeError; else Unavailable. The connection is broken.
func (c *Conn) ioError(ctx context.Context, what string, err error) error {
	var st error
	var e *Error
	switch {
	case ctx.Err() != nil:
		st = contextError(ctx.Err())
	case errors.As(err, &e):
		st = err
	case !c.gotSettings && c.greetLimited && errors.Is(err, os.ErrDeadlineExceeded):
		st = &HandshakeError{Err: context.DeadlineExceeded}
	case !c.gotSettings && !errors.Is(err, os.ErrDeadlineExceeded):
		st = &HandshakeError{Err: err}
	case errors.Is(err, os.ErrDeadlineExceeded):
		st = errorf(DeadlineExceeded, "context deadline exceeded")
	default:
		st = errorf(Unavailable, what+": "+err.Error())
	}
	if c.broken == nil {
		c.broken = st
	}
	c.nc.Close()
	return st
}

// flush writes the pending frames. After a failed write it writes nothing
// more and returns that write's error.
func (c *Conn) flush() error {
	if c.wfail != nil {
		c.wbuf = c.wbuf[:0]
		return c.wfail
	}
	if len(c.wbuf) == 0 {
		return nil
	}
	_, c.wfail = c.nc.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	return c.wfail
}

// step reads and handles one frame, writing what is pending first unless
// the next frame is read already (answers to frames that arrived together
// go out in one write, and nothing waits unsent while reading blocks). A
// write that fails (the server is closing the connection) does not end
// the reading: what the server sent before closing is read all the same.
func (c *Conn) step() error {
	if !c.frameBuffered() {
		_ = c.flush()
	}
	f, err := readFrame(c.br, &c.rbuf)
	if err != nil {
		return err
	}

	return c.handle(f)
}

// frameBuffered reports whether a whole frame is in the read buffer.
func (c *Conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, err := c.br.Peek(3)
	return err == nil && 9+(int(h[0])<<16|int(h[1])<<8|int(h[2])) <= n
}

// call is the state of one call's stream.
type call struct {
	id      uint32
	sendWin int64
	// recv counts DATA bytes since the stream's last WINDOW_UPDATE.
	recv int
	// hdr accumulates a header block split over CONTINUATION frames;
	// inHeaders is set until its END_HEADERS, endAfter when the HEADERS
	// frame ended the stream.
	hdr                 []byte
	inHeaders, endAfter bool
	httpStatus          string
	contentType         string
	grpcStatus          string
	grpcMessage         string
	hasGRPCStatus       bool
	data                []byte
	done                bool
	err                 error
}

// emit receives the decoded header fields of the current call.
func (c *Conn) emit(f hpack.HeaderField) {
	k := c.cur
	if k == nil {
		return
	}
	switch f.Name {
	case ":status":
		k.httpStatus = f.Value
	case "content-type":
		k.contentType = f.Value
	case "grpc-status":
		k.grpcStatus, k.hasGRPCStatus = f.Value, true
	case "grpc-message":
		k.grpcMessage = f.Value
	}
}

// handle acts on one frame from the server.
func (c *Conn) handle(f frame) error {
	k := c.cur
	if k != nil && k.inHeaders && (f.typ != frameContinuation || f.stream != k.id) {
		return errors.New("HTTP/2 protocol error: header block interrupted")
	}
	mine := k != nil && f.stream == k.id && !k.done
	switch f.typ {
	case frameData:
		c.recvConn += len(f.payload)
		if c.recvConn >= ourWindow/2 {
			c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.recvConn))
			c.recvConn = 0
		}
		if !mine {
			return nil
		}
		p, err := unpad(f)
		if err != nil {
			return err
		}
		if len(k.data)+len(p) > MaxReplySize+5 {
			k.err = errorf(ResourceExhausted, fmt.Sprintf("reply larger than %d bytes", MaxReplySize))
			return k.err
		}
		k.data = append(k.data, p...)
		if f.flags&flagEndStream != 0 {
			k.done = true
			return nil
		}
		k.recv += len(f.payload)
		if k.recv >= ourWindow/2 {
			c.wbuf = appendWindowUpdate(c.wbuf, k.id, uint32(k.recv))
			k.recv = 0
		}
	case frameHeaders:
		if !mine {
			// Keep the decoder's table in step all the same.
			return c.decodeHeaders(nil, f)
		}
		return c.decodeHeaders(k, f)
	case frameContinuation:
		if k == nil || !k.inHeaders {
			return errors.New("HTTP/2 protocol error: CONTINUATION without HEADERS")
		}
		k.hdr = append(k.hdr, f.payload...)
		if f.flags&flagEndHeaders != 0 {
			return c.endHeaders(k)
		}
	case frameRSTStream:
		if mine && len(f.payload) == 4 {
			k.done = true
			k.err = resetError(binary.BigEndian.Uint32(f.payload))
		}
	case frameSettings:
		if f.flags&flagAck != 0 {
			return nil
		}
		if len(f.payload)%6 != 0 {
			return errors.New("HTTP/2 protocol error: SETTINGS length")
		}
		for p := f.payload; len(p) > 0; p = p[6:] {
			v := binary.BigEndian.Uint32(p[2:6])
			switch binary.BigEndian.Uint16(p[:2]) {
			case settingInitialWindowSize:
				if v > maxWindow {
					return errors.New("HTTP/2 protocol error: SETTINGS_INITIAL_WINDOW_SIZE too large")
				}
				if k != nil {
					k.sendWin += int64(v) - c.initSend
				}
				c.initSend = int64(v)
			case settingMaxFrameSize:
				if v < defaultMaxFrame || v > maxFrameLimit {
					return errors.New("HTTP/2 protocol error: SETTINGS_MAX_FRAME_SIZE out of range")
				}
				c.maxFrame = int(v)
			case settingHeaderTableSize:
				c.enc.SetMaxDynamicTableSizeLimit(v)
			}
		}
		c.wbuf = appendFrame(c.wbuf, frameSettings, flagAck, 0, nil)
		if !c.gotSettings && c.liftGreetBy != nil {
			c.liftGreetBy()
		}
		c.gotSettings = true
	case framePing:
		if f.flags&flagAck == 0 && len(f.payload) == 8 {
			c.wbuf = appendFrame(c.wbuf, framePing, flagAck, 0, f.payload)
		}
	case frameGoAway:
		if len(f.payload) < 8 {
			return errors.New("HTTP/2 protocol error: GOAWAY length")
		}
		c.goAway = true
		c.lastStream = binary.BigEndian.Uint32(f.payload) & 0x7fffffff
		if k != nil && !k.done && k.id > c.lastStream {
			return errorf(Unavailable, fmt.Sprintf("the server is closing the connection (GOAWAY, error code %d) before this call: %s",
				binary.BigEndian.Uint32(f.payload[4:8]), f.payload[8:]))
		}
	case frameWindowUpdate:
		if len(f.payload) != 4 {
			return errors.New("HTTP/2 protocol error: WINDOW_UPDATE length")
		}
		n := int64(binary.BigEndian.Uint32(f.payload) & 0x7fffffff)
		switch {
		case f.stream == 0:
			c.sendConn += n
		case mine:
			k.sendWin += n
		}
	case framePushPromise:
		return errors.New("HTTP/2 protocol error: PUSH_PROMISE after push was disabled")
	}
	return nil
}

// decodeHeaders starts a header block from a HEADERS frame (k nil: not the
// current call's).
func (c *Conn) decodeHeaders(k *call, f frame) error {
	p, err := unpad(f)
	if err != nil {
		return err
	}
	if f.flags&flagPriority != 0 {
		if len(p) < 5 {
			return errors.New("HTTP/2 protocol error: HEADERS priority")
		}
		p = p[5:]
	}
	if k == nil {
		// Not this call's: decode with nobody listening.
		if f.flags&flagEndHeaders == 0 {
			return errors.New("HTTP/2 protocol error: split header block on another stream")
		}
		cur := c.cur
		c.cur = nil
		_, err := c.dec.Write(p)
		c.cur = cur
		return err
	}
	k.hdr = append(k.hdr[:0], p...)
	k.inHeaders = true
	k.endAfter = f.flags&flagEndStream != 0
	if f.flags&flagEndHeaders != 0 {
		return c.endHeaders(k)
	}
	return nil
}

// endHeaders decodes the complete header block of the current call.
func (c *Conn) endHeaders(k *call) error {
	k.inHeaders = false
	if _, err := c.dec.Write(k.hdr); err != nil {
		return fmt.Errorf("HTTP/2 header block: %w", err)
	}
	if err := c.dec.Close(); err != nil {
		return fmt.Errorf("HTTP/2 header block: %w", err)
	}
	if k.endAfter {
		k.done = true
	}
	return nil
}

// resetError is the status of a stream the server reset with code.
func resetError(code uint32) error {
	c := Internal
	switch code {
	case 0x7: // REFUSED_STREAM
		c = Unavailable
	case 0x8: // CANCEL
		c = Canceled
	case 0xb: // ENHANCE_YOUR_CALM
		c = ResourceExhausted
	case 0xc: // INADEQUATE_SECURITY
		c = PermissionDenied
	}
	return errorf(c, fmt.Sprintf("the server reset the stream (HTTP/2 error code %d)", code))
}

// Invoke calls method ("/package.Service/Method") with the encoded request
// req and returns the encoded reply.
func (c *Conn) Invoke(ctx context.Context, method string, req []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, c.broken
	}
	if c.goAway || c.nextStream > maxWindow {
		return nil, errorf(Unavailable, "the server closed the connection (GOAWAY)")
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(err)
	}
	k := &call{id: c.nextStream, sendWin: c.initSend}
	c.nextStream += 2
	c.cur = k
	lift, stop := c.watch(ctx)
	c.liftGreetBy = lift
	defer func() {
		stop()
		c.cur, c.liftGreetBy = nil, nil
	}()
	if err := c.send(ctx, k, method, req); err != nil {
		return nil, c.ioError(ctx, "sending the request", err)
	}
	for !k.done {
		if err := c.step(); err != nil {
			return nil, c.ioError(ctx, "reading the reply", err)
		}
	}
	if err := c.flush(); err != nil {
		// The reply is in: only later calls lose the connection.
		_ = c.ioError(ctx, "answering the server", err)
	}
	if k.err != nil {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			// The server gave up at the deadline it was sent.
			return nil, errorf(DeadlineExceeded, "context deadline exceeded")
		}
		return nil, k.err
	}
	return k.result()
}

// send writes the request's HEADERS and DATA, within the server's windows.
func (c *Conn) send(ctx context.Context, k *call, method string, msg []byte) error {
	c.hbuf.Reset()
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: method},
		{Name: ":authority", Value: "localhost"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	if d, ok := ctx.Deadline(); ok {
		fields = append(fields, hpack.HeaderField{Name: "grpc-timeout", Value: encodeTimeout(time.Until(d))})
	}
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return err
		}
	}
	block := c.hbuf.Bytes()
	for typ := byte(frameHeaders); ; typ = frameContinuation {
		n := min(len(block), c.maxFrame)
		var fl byte
		if n == len(block) {
			fl = flagEndHeaders
		}
		c.wbuf = appendFrame(c.wbuf, typ, fl, k.id, block[:n])
		block = block[n:]
		if len(block) == 0 {
			break
		}
	}

	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	for len(body) > 0 {
		n := int64(min(len(body), c.maxFrame))
		n = min(n, c.sendConn, k.sendWin)
		if n <= 0 {
			// Wait for the server's WINDOW_UPDATE (or its early reply).
			if err := c.step(); err != nil {
				return err
			}
			if k.done {
				return nil
			}
			continue
		}
		var fl byte
		if int(n) == len(body) {
			fl = flagEndStream
		}
		c.wbuf = appendFrame(c.wbuf, frameData, fl, k.id, body[:n])
		body = body[n:]
		c.sendConn -= n
		k.sendWin -= n
	}
	return c.flush()
}

// result is the finished stream's reply message, or its error.
func (k *call) result() ([]byte, error) {
	if !k.hasGRPCStatus {
		if k.httpStatus != "" && k.httpStatus != "200" {
			return nil, errorf(httpCode(k.httpStatus), fmt.Sprintf("unexpected HTTP status %s from the server (content-type %q)", k.httpStatus, k.contentType))
		}
		return nil, errorf(Internal, "the server ended the stream without a grpc-status")
	}
	code, err := strconv.ParseUint(k.grpcStatus, 10, 32)
	if err != nil {
		return nil, errorf(Internal, fmt.Sprintf("malformed grpc-status %q", k.grpcStatus))
	}
	if code != 0 {
		return nil, errorf(Code(code), decodeMessage(k.grpcMessage))
	}
	d := k.data
	if len(d) < 5 {
		return nil, errorf(Internal, "the server sent no reply message")
	}
	if d[0] != 0 {
		return nil, errorf(Internal, "the server sent a compressed reply, which was not asked for")
	}
	n := binary.BigEndian.Uint32(d[1:5])
	if uint64(n) != uint64(len(d)-5) {
		return nil, errorf(Internal, fmt.Sprintf("reply framing: message of %d bytes announced, %d received", n, len(d)-5))
	}
	return d[5:], nil
}

// httpCode maps an HTTP status without grpc-status to a gRPC code, as
// gRPC's HTTP/2 protocol says.
func httpCode(s string) Code {
	switch s {
	case "400":
		return Internal
	case "401":
		return Unauthenticated
	case "403":
		return PermissionDenied
	case "404":
		return Unimplemented
	case "429", "502", "503", "504":
		return Unavailable
	}
	return Unknown
}

// encodeTimeout formats d as a grpc-timeout value: at most 8 digits and a
// unit, rounded up.
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	units := []struct {
		d time.Duration
		s string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}, {time.Hour, "H"}}
	for _, u := range units {
		v := d / u.d
		if d%u.d != 0 {
			v++
		}
		if v <= 99999999 {
			return strconv.FormatInt(int64(v), 10) + u.s
		}
	}
	return "99999999H"
}

// decodeMessage undoes grpc-message's percent-encoding; a malformed escape
// is kept as it is.
func decodeMessage(s string) string {
	if !bytes.Contains([]byte(s), []byte{'%'}) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b = append(b, byte(v))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}
