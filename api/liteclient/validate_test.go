package liteclient

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/unarygrpc"
)

// TestRefusesInvalidUTF8: a request with a string field that is not UTF-8
// (one the generated code refuses to encode) is refused with
// INVALID_ARGUMENT naming the field, and nothing is sent: the client has
// no connection, so a call that went further would panic.
func TestRefusesInvalidUTF8(t *testing.T) {
	const bad = "pod-\xff"
	labels := func(k, v string) map[string]string { return map[string]string{"cni.network": "n", k: v} }
	cases := []struct {
		field string
		call  func(*Client) error
		gen   proto.Message
	}{
		{"prepare.container_id", func(c *Client) error {
			_, err := c.Attach(context.Background(), &AttachRequest{Prepare: &PrepareRequest{ContainerID: bad}, NetnsPath: "/n"})
			return err
		}, &pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: bad}}},
		{`prepare.labels["cni.arg.K8S_POD_NAME"]`, func(c *Client) error {
			_, err := c.Attach(context.Background(), &AttachRequest{Prepare: &PrepareRequest{ContainerID: "c1", Labels: labels("cni.arg.K8S_POD_NAME", bad)}, NetnsPath: "/n"})
			return err
		}, &pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "c1", Labels: labels("cni.arg.K8S_POD_NAME", bad)}}},
		{`prepare.labels key "k\xff"`, func(c *Client) error {
			_, err := c.Attach(context.Background(), &AttachRequest{Prepare: &PrepareRequest{ContainerID: "c1", Labels: labels("k\xff", "v")}, NetnsPath: "/n"})
			return err
		}, &pb.AttachRequest{Prepare: &pb.PrepareRequest{ContainerId: "c1", Labels: labels("k\xff", "v")}}},
		{"netns_path", func(c *Client) error {
			_, err := c.Attach(context.Background(), &AttachRequest{Prepare: &PrepareRequest{ContainerID: "c1"}, NetnsPath: "/proc/1/ns/\xc3\x28"})
			return err
		}, &pb.AttachRequest{Target: &pb.AttachRequest_NetnsPath{NetnsPath: "/proc/1/ns/\xc3\x28"}}},
		{`require_labels["cni.network"]`, func(c *Client) error {
			_, err := c.Attach(context.Background(), &AttachRequest{Prepare: &PrepareRequest{ContainerID: "c1"}, NetnsPath: "/n", RequireLabels: map[string]string{"cni.network": bad}})
			return err
		}, &pb.AttachRequest{RequireLabels: map[string]string{"cni.network": bad}}},
		{"container_id", func(c *Client) error {
			_, err := c.Cleanup(context.Background(), &CleanupRequest{ContainerID: bad})
			return err
		}, &pb.CleanupRequest{ContainerId: bad}},
		{`require_labels["cni.ifname"]`, func(c *Client) error {
			_, err := c.Cleanup(context.Background(), &CleanupRequest{ContainerID: "c1", RequireLabels: map[string]string{"cni.ifname": bad}})
			return err
		}, &pb.CleanupRequest{ContainerId: "c1", RequireLabels: map[string]string{"cni.ifname": bad}}},
		{"container_id", func(c *Client) error {
			_, err := c.Get(context.Background(), &GetRequest{ContainerID: bad})
			return err
		}, &pb.GetRequest{ContainerId: bad}},
	}
	for _, tc := range cases {
		if _, err := proto.Marshal(tc.gen); err == nil {
			t.Fatalf("%s: the generated code encodes %v: not a bad input", tc.field, tc.gen)
		}
		err := tc.call(&Client{})
		var st *unarygrpc.Error
		if err == nil || !errors.As(err, &st) || st.Code != unarygrpc.InvalidArgument || !strings.HasPrefix(st.Message, tc.field+": ") {
			t.Errorf("%s: error %v, want INVALID_ARGUMENT starting with the field", tc.field, err)
		}
	}
	// Valid UTF-8 beyond ASCII passes the check (and is sent).
	ok := &AttachRequest{Prepare: &PrepareRequest{ContainerID: "c1", Labels: labels("cni.arg.K8S_POD_NAME", "pod-ü")}, NetnsPath: "/n"}
	if err := ok.check(); err != nil {
		t.Errorf("valid UTF-8 refused: %v", err)
	}
}
