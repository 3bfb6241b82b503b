package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/isolatord/isolatord/api"
	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
)

// cniErr asserts err is a CNI error with the code and returns it.
func cniErr(t *testing.T, err error, code uint) *types.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want CNI error %d, got nil", code)
	}
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want CNI error %d, got %T: %v", code, err, err)
	}
	if e.Code != code {
		t.Fatalf("want CNI error code %d, got %d: %s (%s)", code, e.Code, e.Msg, e.Details)
	}
	return e
}

func TestParseConfigDefaultsAndPortForms(t *testing.T) {
	conf, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"isolator","type":"isolator-cni"}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.Socket != api.DefaultSocket {
		t.Errorf("socket = %q, want default %q", conf.Socket, api.DefaultSocket)
	}
	if !conf.Ports.Empty() || !conf.SharedPorts.Empty() {
		t.Errorf("ports = %s / %s, want empty", conf.Ports, conf.SharedPorts)
	}

	for _, tc := range []struct{ ports, want string }{
		{`"31000-31003,31010"`, "31000-31003,31010"},
		{`[31010, "31000-31003"]`, "31000-31003,31010"},
		{`["31000", "31001-31002", 31003]`, "31000-31003"},
		{`null`, ""},
	} {
		conf, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"isolator-cni","socket":"/x.sock","ports":` + tc.ports + `}`))
		if err != nil {
			t.Errorf("ports %s: %v", tc.ports, err)
			continue
		}
		if got := conf.Ports.String(); got != tc.want {
			t.Errorf("ports %s parsed as %q, want %q", tc.ports, got, tc.want)
		}
		if conf.Socket != "/x.sock" {
			t.Errorf("socket = %q", conf.Socket)
		}
	}
}

func TestParseConfigRefusesBadPorts(t *testing.T) {
	for _, tc := range []struct{ conf, want string }{
		{`"ports":"0"`, "out of range"},
		{`"ports":[70000]`, "out of range"},
		{`"ports":[true]`, "element 0"},
		{`"ports":{"a":1}`, "want a port list"},
		{`"sharedPorts":"31005-31001"`, "reversed"},
	} {
		_, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"n",` + tc.conf + `}`))
		e := cniErr(t, err, types.ErrDecodingFailure)
		if !strings.Contains(e.Msg, tc.want) {
			t.Errorf("%s: message %q lacks %q", tc.conf, e.Msg, tc.want)
		}
	}
	_, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","ports":"31000-31010","sharedPorts":[31005]}`))
	e := cniErr(t, err, types.ErrInvalidNetworkConfig)
	if !strings.Contains(e.Msg, "31005") || !strings.Contains(e.Msg, "sharedPorts") {
		t.Errorf("overlap message %q should name port 31005 and sharedPorts", e.Msg)
	}
}

func TestParseConfigPrevResultAndAttachments(t *testing.T) {
	conf, err := parseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"lo","sandbox":"/run/netns/x"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.PrevResult == nil {
		t.Fatal("prevResult not parsed")
	}
	if conf.hasAttachments {
		t.Error("hasAttachments without the key")
	}

	conf, err = parseGCConfig([]byte(`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !conf.hasAttachments || len(conf.attachments()) != 0 {
		t.Errorf("empty valid-attachments: has=%v list=%v", conf.hasAttachments, conf.attachments())
	}
	conf, err = parseGCConfig([]byte(`{"cniVersion":"1.1.0","name":"n","cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := conf.attachments(); !conf.hasAttachments || len(got) != 1 || got[0].ContainerID != "a" {
		t.Errorf("legacy attachments: has=%v list=%v", conf.hasAttachments, got)
	}
}

func confWith(t *testing.T, extra string) *NetConf {
	t.Helper()
	conf, err := parseConfig([]byte(`{"cniVersion":"1.1.0","name":"isolator","type":"isolator-cni"` + extra + `}`))
	if err != nil {
		t.Fatalf("config %s: %v", extra, err)
	}
	return conf
}

func TestPortMappingsTCPAndUDPAreOnePort(t *testing.T) {
	conf := confWith(t, `,"runtimeConfig":{"portMappings":[
		{"hostPort":31001,"containerPort":31001,"protocol":"tcp"},
		{"hostPort":31001,"containerPort":31001,"protocol":"udp"},
		{"hostPort":31005,"containerPort":31005,"protocol":"TCP"},
		{"hostPort":31005,"containerPort":0}]}`)
	req, err := requestedPorts(conf, nil, "198.18.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Exclusive.String(); got != "31001,31005" {
		t.Errorf("exclusive = %q, want 31001,31005", got)
	}
	if !req.Shared.Empty() {
		t.Errorf("shared = %s, want none", req.Shared)
	}
	ps := req.Proto()
	if len(ps) != 2 || ps[0].Begin != 31001 || ps[0].End != 31001 || ps[1].Begin != 31005 || ps[0].Shared {
		t.Errorf("proto = %v, want two single exclusive ports", ps)
	}
}

func TestPortMappingDifferentContainerPortRefused(t *testing.T) {
	conf := confWith(t, `,"runtimeConfig":{"portMappings":[
		{"hostPort":31001,"containerPort":31001,"protocol":"tcp"},
		{"hostPort":31002,"containerPort":8080,"protocol":"tcp"}]}`)
	_, err := requestedPorts(conf, nil, "198.18.0.1")
	e := cniErr(t, err, types.ErrInvalidNetworkConfig)
	for _, want := range []string{"portMappings[1]", "hostPort: 31002", "containerPort: 8080", "without NAT", "use containerPort 31002"} {
		if !strings.Contains(e.Msg, want) {
			t.Errorf("message %q lacks %q", e.Msg, want)
		}
	}
}

func TestPortMappingValidation(t *testing.T) {
	for _, tc := range []struct{ mapping, want string }{
		{`{"hostPort":0,"containerPort":0}`, "hostPort 0 is out of range"},
		{`{"hostPort":70000,"containerPort":70000}`, "hostPort 70000 is out of range"},
		{`{"hostPort":31001,"containerPort":-1}`, "containerPort -1"},
		{`{"hostPort":31001,"containerPort":31001,"protocol":"sctp"}`, `protocol "sctp"`},
		{`{"hostPort":31001,"containerPort":31001,"hostIP":"198.18.0.9"}`, "hostIP 198.18.0.9 is not the host address 198.18.0.1"},
		{`{"hostPort":31001,"containerPort":31001,"hostIP":"nope"}`, `hostIP "nope" is not an IP`},
	} {
		conf := confWith(t, `,"runtimeConfig":{"portMappings":[`+tc.mapping+`]}`)
		_, err := requestedPorts(conf, nil, "198.18.0.1")
		e := cniErr(t, err, types.ErrInvalidNetworkConfig)
		if !strings.Contains(e.Msg, tc.want) || !strings.Contains(e.Msg, "portMappings[0]") {
			t.Errorf("%s: message %q lacks %q", tc.mapping, e.Msg, tc.want)
		}
	}
	for _, ip := range []string{"", "0.0.0.0", "::", "198.18.0.1"} {
		conf := confWith(t, `,"runtimeConfig":{"portMappings":[{"hostPort":31001,"containerPort":31001,"hostIP":"`+ip+`"}]}`)
		if _, err := requestedPorts(conf, nil, "198.18.0.1"); err != nil {
			t.Errorf("hostIP %q: %v", ip, err)
		}
	}
}

func TestRequestedPortsMergesStaticSharedAndArgs(t *testing.T) {
	conf := confWith(t, `,"ports":"31000,31010-31011","sharedPorts":[31443],
		"runtimeConfig":{"portMappings":[
			{"hostPort":31000,"containerPort":31000},
			{"hostPort":31443,"containerPort":31443,"protocol":"udp"},
			{"hostPort":31500,"containerPort":31500},
			{"hostPort":31600,"containerPort":31600}]}`)
	args, err := parseArgs("IgnoreUnknown=1;ISOLATOR_SHARED_PORTS=31600, 31601;K8S_POD_NAME=web-0")
	if err != nil {
		t.Fatal(err)
	}
	req, err := requestedPorts(conf, args, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := req.String(), "31000,31010-31011,31500 + shared 31443,31600-31601"; got != want {
		t.Errorf("request = %q, want %q", got, want)
	}
	back := portRequestFromProto(req.Proto())
	if !back.Equal(req) {
		t.Errorf("proto round trip: %s != %s", back, req)
	}

	// Shared through CNI_ARGS may not take a port the network holds exclusively.
	args["ISOLATOR_SHARED_PORTS"] = "31010"
	e := cniErr(t, mustErr(requestedPorts(conf, args, "")), types.ErrInvalidNetworkConfig)
	if !strings.Contains(e.Msg, "31010") {
		t.Errorf("message %q should name 31010", e.Msg)
	}
	args["ISOLATOR_SHARED_PORTS"] = "31600-"
	cniErr(t, mustErr(requestedPorts(conf, args, "")), types.ErrInvalidEnvironmentVariables)
}

func mustErr(_ PortRequest, err error) error { return err }

func TestPortRequestFromProtoIgnoresNonsense(t *testing.T) {
	got := portRequestFromProto([]*pb.PortRange{
		{Begin: 31000, End: 31001},
		{Begin: 0, End: 5},
		{Begin: 9, End: 3},
		{Begin: 65535, End: 70000},
		{Begin: 40000, End: 40000, Shared: true},
	})
	want := PortRequest{Exclusive: ephemeral.MustParseSet("31000-31001,65535"), Shared: ephemeral.MustParseSet("40000")}
	if !got.Equal(want) {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestParseArgsAndLabels(t *testing.T) {
	a, err := parseArgs("IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;NOMAD_ALLOC_ID=abc;;OTHER=x")
	if err != nil {
		t.Fatal(err)
	}
	l := a.labels("isolator", "eth0")
	want := map[string]string{
		LabelNetwork: "isolator", LabelIfName: "eth0",
		"cni.arg.K8S_POD_NAMESPACE": "default", "cni.arg.K8S_POD_NAME": "web-0", "cni.arg.NOMAD_ALLOC_ID": "abc",
	}
	if len(l) != len(want) {
		t.Errorf("labels = %v, want %v", l, want)
	}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("label %s = %q, want %q", k, l[k], v)
		}
	}
	_, err = parseArgs("K8S_POD_NAME")
	cniErr(t, err, types.ErrInvalidEnvironmentVariables)
	if a, err := parseArgs(""); err != nil || len(a) != 0 {
		t.Errorf("empty args: %v %v", a, err)
	}
}

func TestCheckContainerIDAndIfName(t *testing.T) {
	ok := []string{"c1", strings.Repeat("a", 64), strings.Repeat("f", 128), "Pod_1.2-x"}
	for _, id := range ok {
		if err := checkContainerID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	e := cniErr(t, checkContainerID(strings.Repeat("a", 129)), types.ErrInvalidEnvironmentVariables)
	if !strings.Contains(e.Msg, "129 characters") {
		t.Errorf("message %q should say how long", e.Msg)
	}
	for _, id := range []string{"", "-a", "a/b", "a b"} {
		cniErr(t, checkContainerID(id), types.ErrInvalidEnvironmentVariables)
	}
	if err := checkIfName("eth0"); err != nil {
		t.Error(err)
	}
	e = cniErr(t, checkIfName("net1"), types.ErrInvalidEnvironmentVariables)
	if !strings.Contains(e.Msg, `"net1"`) {
		t.Errorf("message %q should name net1", e.Msg)
	}
}
