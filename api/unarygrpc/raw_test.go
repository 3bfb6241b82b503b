package unarygrpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
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
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

// serveRaw accepts one connection on a fresh socket, reads the client's
// preface, sends settings, and runs script on it; it returns the socket.
func serveRaw(t *testing.T, settings []http2.Setting, script func(s *rawServer)) string {
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
		s := &rawServer{t: t, fr: http2.NewFramer(nc, nc)}
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
	if err := c.Invoke(context.Background(), mStatus, &pb.StatusRequest{}, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("reply %v, want %v", &got, want)
	}
}

// TestSmallServerWindow: a server announcing a 7-byte stream window and
// granting 7 bytes at a time gets the request in pieces no larger.
func TestSmallServerWindow(t *testing.T) {
	req := &pb.GetRequest{ContainerId: "a-container-with-a-long-name"}
	sock := serveRaw(t, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 7}}, func(s *rawServer) {
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
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
			BlockFragment: s.headers(":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "container_id: %22x%22 is not known %E2%9C%97")})
		s.drain()
	})
	c := rawDial(t, sock)
	err := c.Invoke(context.Background(), mGet, req, &pb.GetResponse{})
	st, _ := status.FromError(err)
	if st.Code() != codes.NotFound || st.Message() != "container_id: \"x\" is not known ✗" {
		t.Fatalf("error %v, want NotFound with the decoded message", err)
	}
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
			err := c.Invoke(ctx, mStatus, &pb.StatusRequest{}, &pb.StatusResponse{})
			if status.Code(err) != tc.code {
				t.Fatalf("error %v, want %v", err, tc.code)
			}
		})
	}
}

// TestHandshakeDeadline: a server that accepts but never speaks HTTP/2
// leaves Dial to its context.
func TestHandshakeDeadline(t *testing.T) {
	dir, err := os.MkdirTemp("", "umute")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := unarygrpc.Dial(ctx, sock); err == nil {
		t.Fatal("Dial succeeded without a server greeting")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Dial took %v past a 200ms deadline", d)
	}
}
