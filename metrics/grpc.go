package metrics

import (
	"context"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// UnknownUID is the peer_uid label of calls whose caller's uid is unknown
// (no peer credentials, or uid returned "").
const UnknownUID = "unknown"

// UnaryServerInterceptor counts every unary call in
// isolatord_rpc_requests_total{method,code,peer_uid} and times it in
// isolatord_rpc_duration_seconds{method}. uid returns the caller's uid as a
// label value (the daemon's uidLabel); nil or "" gives "unknown". Put it
// first in the chain so that calls refused by authorization are counted too
// (code="PermissionDenied" with the refused uid).
func (m *Metrics) UnaryServerInterceptor(uid func(context.Context) string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.rpcDuration.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
		u := ""
		if uid != nil {
			u = uid(ctx)
		}
		if u == "" {
			u = UnknownUID
		}
		m.rpcRequests.WithLabelValues(info.FullMethod, status.Code(err).String(), u).Inc()
		return resp, err
	}
}

// InitRPC creates, at zero, the RPC series of every unary method registered
// on srv: isolatord_rpc_duration_seconds{method} and
// isolatord_rpc_requests_total{method,code,peer_uid} for every gRPC code and
// each of peerUIDs (the uids allowed to call, as label values). Call it after
// registering the services and before serving.
func (m *Metrics) InitRPC(srv interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}, peerUIDs ...string) {
	var methods []string
	for name, info := range srv.GetServiceInfo() {
		for _, mi := range info.Methods {
			if !mi.IsClientStream && !mi.IsServerStream {
				methods = append(methods, "/"+name+"/"+mi.Name)
			}
		}
	}
	sort.Strings(methods)
	m.InitRPCMethods(methods, peerUIDs...)
}

// InitRPCMethods is InitRPC for an explicit list of full method names
// ("/isolatord.v1.Isolator/Prepare").
func (m *Metrics) InitRPCMethods(methods []string, peerUIDs ...string) {
	for _, meth := range methods {
		m.rpcDuration.WithLabelValues(meth)
		for _, u := range peerUIDs {
			for _, c := range allCodes() {
				m.rpcRequests.WithLabelValues(meth, c.String(), u)
			}
		}
	}
}
