package main

import (
	"context"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// anyHostIP reports whether a port mapping's hostIP means every host
// address (or none is given).
func anyHostIP(ip string) bool {
	switch ip {
	case "", "0.0.0.0", "::":
		return true
	}
	return false
}

// namesHostIP reports whether a runtime port mapping names one host
// address, which must then be the address isolatord's containers share.
func namesHostIP(conf *NetConf) bool {
	for _, m := range conf.RuntimeConfig.PortMappings {
		if !anyHostIP(m.HostIP) {
			return true
		}
	}
	return false
}

// hostIP asks isolatord (Status) for the address its containers share,
// but only when a port mapping names a host address to check against it:
// otherwise ADD and CHECK need no round trip beyond their own calls, and
// it returns "".
func hostIP(ctx context.Context, c isolatordv1grpc.IsolatorClient, conf *NetConf) (string, error) {
	if !namesHostIP(conf) {
		return "", nil
	}
	st, err := c.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return "", daemonError("Status", err)
	}
	return st.GetHostIp(), nil
}
