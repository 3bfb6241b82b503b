package unarygrpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/unarygrpc"
)

// rawServer is one HTTP/2 connection whose frames a test writes itself,
// for what a grpc-go server does rarely or never on demand.
type rawServer struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

// serveRaw accepts one connection on a fresh socket, reads the client's
// preface, sends settings, and runs script on it; it returns the socket.
func serveRaw(t *testing.T, settings []http2.Setting, script func(s *rawServer)) string {
	t.Helper()
	sock, lis := listenUnix(t)
	done := make(chan struct{})
	t.Cleanup(func() { lis.Close(); <-done })
	go func() {
		defer close(done)
		nc, err := lis.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		pre := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(nc, pre); err != nil || string(pre) != http2.ClientPreface {
			t.Errorf("preface %q: %v", pre, err)
			return
		}
		s := &rawServer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		s.enc = hpack.NewEncoder(&s.hbuf)
		if err := s.fr.WriteSettings(settings...); err != nil {
			t.Error(err)
			return
		}
		script(s)
	}()
	return sock
}

// request reads frames until a whole request; it answers SETTINGS and
// calls onData for each DATA frame.
func (s *rawServer) request(onData func(f *http2.DataFrame)) (stream uint32, path string, body []byte) {
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			s.t.Errorf("server read: %v", err)
			return 0, "", nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				s.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			stream, path = f.StreamID, f.PseudoValue("path")
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			if onData != nil {
				onData(f)
			}
			if f.StreamEnded() {
				return stream, path, body
			}
		}
	}
}

// drain reads frames until the client closes the connection.
func (s *rawServer) drain() {
	for {
		if _, err := s.fr.ReadFrame(); err != nil {
			return
		}
	}
}

// headers encodes fields as one header block.
func (s *rawServer) headers(kv ...string) []byte {
	s.hbuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		s.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return append([]byte(nil), s.hbuf.Bytes()...)
}

// grpcMessage frames m with gRPC's 5-byte prefix.
func grpcMessage(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

func rawDial(t *testing.T, sock string) *unarygrpc.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := unarygrpc.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPingPaddingContinuation: the server PINGs before replying and waits
// for the answer, then replies with padded DATA in two frames and
// trailers split over HEADERS and CONTINUATION.
func TestPingPaddingContinuation(t *testing.T) {
	want := &pb.StatusResponse{Version: "raw", HostIp: "198.18.0.1"}
	sock := serveRaw(t, nil, func(s *rawServer) {
		id, path, _ := s.request(nil)
		if path != mStatus {
			t.Errorf("path %q", path)
		}
		s.fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8})
		for acked := false; !acked; {
			f, err := s.fr.ReadFrame()
			if err != nil {
				t.Errorf("waiting for the PING ACK: %v", err)
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
				acked = true
			}
		}
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: s.headers(":status", "200", "content-type", "application/grpc")})
		msg := grpcMessage(t, want)
		s.fr.WriteDataPadded(id, false, msg[:3], make([]byte, 7))
		s.fr.WriteDataPadded(id, false, msg[3:], make([]byte, 2))
		tr := s.headers("grpc-status", "0", "grpc-message", "")
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndStream: true, BlockFragment: tr[:1]})
		s.fr.WriteContinuation(id, true, tr[1:])
		s.drain()
	})
	c := rawDial(t, sock)
	var got pb.StatusResponse
	if err := invoke(context.Background(), c, mStatus, &pb.StatusRequest{}, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("reply %v, want %v", &got, want)
	}
}

// TestSmallServerWindow: once a server has announced a 7-byte stream
// window, granting 7 bytes at a time, it gets a request in pieces no
// larger. (The first call on a connection is sent before the server's
// SETTINGS arrive, under HTTP/2's default window.)
func TestSmallServerWindow(t *testing.T) {
	req := &pb.GetRequest{ContainerId: "a-container-with-a-long-name"}
	notKnown := func(s *rawServer, id uint32) {
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
			BlockFragment: s.headers(":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "container_id: %22x%22 is not known %E2%9C%97")})
	}
	sock := serveRaw(t, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 7}}, func(s *rawServer) {
		id, _, _ := s.request(nil)
		notKnown(s, id)
		id, _, body := s.request(func(f *http2.DataFrame) {
			if n := len(f.Data()); n > 7 {
				t.Errorf("DATA frame of %d bytes in a 7-byte window", n)
			}
			if !f.StreamEnded() {
				s.fr.WriteWindowUpdate(f.StreamID, uint32(len(f.Data())))
			}
		})
		if !bytes.Equal(body, grpcMessage(t, req)) {
			t.Errorf("request body %x", body)
		}
		notKnown(s, id)
		s.drain()
	})
	c := rawDial(t, sock)
	for i := 0; i < 2; i++ {
		err := invoke(context.Background(), c, mGet, req, &pb.GetResponse{})
		st, _ := status.FromError(err)
		if st.Code() != codes.NotFound || st.Message() != "container_id: \"x\" is not known ✗" {
			t.Fatalf("call %d: error %v, want NotFound with the decoded message", i, err)
		}
	}
}

// listenUnix listens on a fresh unix socket (under /tmp: a test's own
// directory may be too long for a socket path) until the test ends.
func listenUnix(t *testing.T) (string, net.Listener) {
	t.Helper()
	dir, err := os.MkdirTemp("", "uraw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return sock, lis
}

// TestFirstCallIsOneWrite: Dial waits for nothing, and the first call
// writes the preface, SETTINGS, WINDOW_UPDATE, HEADERS and the whole DATA
// at once, without waiting for the server's SETTINGS: a server that reads
// one chunk before it says anything finds the complete request in it.
func TestFirstCallIsOneWrite(t *testing.T) {
	sock, lis := listenUnix(t)
	req := &pb.GetRequest{ContainerId: "c1"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := lis.Accept()
		if err != nil {
			t.Error(err)
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64<<10)
		n, err := nc.Read(buf)
		if err != nil {
			t.Errorf("first read: %v", err)
			return
		}
		chunk := buf[:n]
		if !bytes.HasPrefix(chunk, []byte(http2.ClientPreface)) {
			t.Errorf("first chunk %q does not start with the preface", chunk)
			return
		}
		fr := http2.NewFramer(io.Discard, bytes.NewReader(chunk[len(http2.ClientPreface):]))
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		var types []http2.FrameType
		var body []byte
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				break
			}
			types = append(types, f.Header().Type)
			if d, ok := f.(*http2.DataFrame); ok {
				body = append(body, d.Data()...)
				if !d.StreamEnded() {
					t.Errorf("DATA without END_STREAM")
				}
			}
		}
		want := []http2.FrameType{http2.FrameSettings, http2.FrameWindowUpdate, http2.FrameHeaders, http2.FrameData}
		if fmt.Sprint(types) != fmt.Sprint(want) {
			t.Errorf("first chunk holds frames %v, want %v", types, want)
		}
		if !bytes.Equal(body, grpcMessage(t, req)) {
			t.Errorf("request body %x", body)
		}
		// Now greet and answer (the client's frames were read above).
		s := &rawServer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		s.enc = hpack.NewEncoder(&s.hbuf)
		s.fr.WriteSettings()
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true,
			BlockFragment: s.headers(":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "gone")})
		s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		s.drain()
	}()
	c := rawDial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := invoke(ctx, c, mGet, req, &pb.GetResponse{})
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != "gone" {
		t.Fatalf("error %v, want NotFound gone", err)
	}
	c.Close()
	<-done
}

// TestResetGoAwayHTTPStatus: RST_STREAM, a GOAWAY that excludes the call
// and an HTTP error without grpc-status become statuses.
func TestResetGoAwayHTTPStatus(t *testing.T) {
	cases := []struct {
		name  string
		reply func(s *rawServer, id uint32)
		code  codes.Code
	}{
		{"RST_STREAM REFUSED_STREAM", func(s *rawServer, id uint32) { s.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) }, codes.Unavailable},
		{"RST_STREAM INTERNAL_ERROR", func(s *rawServer, id uint32) { s.fr.WriteRSTStream(id, http2.ErrCodeInternal) }, codes.Internal},
		{"GOAWAY", func(s *rawServer, id uint32) { s.fr.WriteGoAway(id-1, http2.ErrCodeNo, []byte("shutting down")) }, codes.Unavailable},
		{"HTTP 503", func(s *rawServer, id uint32) {
			s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: s.headers(":status", "503", "content-type", "text/plain")})
		}, codes.Unavailable},
		{"no trailers", func(s *rawServer, id uint32) {
			s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: s.headers(":status", "200", "content-type", "application/grpc")})
			s.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
		}, codes.Internal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := serveRaw(t, nil, func(s *rawServer) {
				id, _, _ := s.request(nil)
				tc.reply(s, id)
				s.drain()
			})
			c := rawDial(t, sock)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := invoke(ctx, c, mStatus, &pb.StatusRequest{}, &pb.StatusResponse{})
			if status.Code(err) != tc.code {
				t.Fatalf("error %v, want %v", err, tc.code)
			}
		})
	}
}

// TestHandshakeDeadline: against a server that accepts but never speaks
// HTTP/2, Dial returns at once and the first call fails with a
// *HandshakeError wrapping context.DeadlineExceeded at Dial's deadline,
// although its own context allows longer.
func TestHandshakeDeadline(t *testing.T) {
	sock, _ := listenUnix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	c, err := unarygrpc.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	_, err = c.Invoke(cctx, mStatus, nil)
	var he *unarygrpc.HandshakeError
	if !errors.As(err, &he) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call without a greeting = %v, want a HandshakeError wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the call took %v past Dial's 200ms deadline", d)
	}
	// The connection stays broken.
	if _, err := c.Invoke(cctx, mStatus, nil); !errors.As(err, &he) {
		t.Fatalf("second call = %v, want the HandshakeError again", err)
	}
}

// TestGreetingLiftsDialDeadline: once the server has greeted, the call
// runs to its own deadline, past Dial's.
func TestGreetingLiftsDialDeadline(t *testing.T) {
	dialDeadline := time.Now().Add(300 * time.Millisecond)
	sock := serveRaw(t, nil, func(s *rawServer) {
		id, _, _ := s.request(nil)
		<-time.After(time.Until(dialDeadline) + 200*time.Millisecond)
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: s.headers(":status", "200", "content-type", "application/grpc")})
		s.fr.WriteData(id, false, grpcMessage(t, &pb.StatusResponse{Version: "late"}))
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: s.headers("grpc-status", "0")})
		s.drain()
	})
	ctx, cancel := context.WithDeadline(context.Background(), dialDeadline)
	defer cancel()
	c, err := unarygrpc.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	var got pb.StatusResponse
	if err := invoke(cctx, c, mStatus, &pb.StatusRequest{}, &got); err != nil || got.GetVersion() != "late" {
		t.Fatalf("call answered after Dial's deadline = %v, %v", &got, err)
	}
	if time.Now().Before(dialDeadline) {
		t.Fatal("the answer came before Dial's deadline: the test proves nothing")
	}
}
