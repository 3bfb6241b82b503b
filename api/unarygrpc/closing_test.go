package unarygrpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
)

// TestReplyFromClosingServer: a server that sends its whole reply while
// it closes the connection (a daemon stopping gracefully), with a PING
// among the frames, still gives the call its reply: the client's PING
// ACK (or SETTINGS ACK) that can no longer be written does not turn a
// call the server carried out into a failure.
func TestReplyFromClosingServer(t *testing.T) {
	want := &pb.StatusResponse{Version: "closing"}
	sock := serveRaw(t, nil, func(s *rawServer) {
		id, _, _ := s.request(nil)
		// from now on every write of the client fails (EPIPE)
		if err := s.nc.(*net.UnixConn).CloseRead(); err != nil {
			t.Error(err)
			return
		}
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: s.headers(":status", "200", "content-type", "application/grpc")})
		s.fr.WritePing(false, [8]byte{1})
		s.fr.WriteData(id, false, grpcMessage(t, want))
		s.fr.WritePing(false, [8]byte{2})
		s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: s.headers("grpc-status", "0")})
		s.fr.WriteGoAway(id, http2.ErrCodeNo, nil)
	})
	c := rawDial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got pb.StatusResponse
	if err := invoke(ctx, c, mStatus, &pb.StatusRequest{}, &got); err != nil {
		t.Fatalf("the server replied in full, yet: %v", err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("reply %v, want %v", &got, want)
	}
	if err := invoke(ctx, c, mStatus, &pb.StatusRequest{}, &got); err == nil {
		t.Fatal("a second call on the closed connection succeeded")
	}
}
