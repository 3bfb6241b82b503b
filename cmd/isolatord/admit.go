package main

import (
	"context"
	"runtime"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// writeMethods are the calls that change containers.
var writeMethods = map[string]bool{
	pbgrpc.Isolator_Prepare_FullMethodName: true,
	pbgrpc.Isolator_Isolate_FullMethodName: true,
	pbgrpc.Isolator_Attach_FullMethodName:  true,
	pbgrpc.Isolator_Update_FullMethodName:  true,
	pbgrpc.Isolator_Cleanup_FullMethodName: true,
}

// cpus is how many CPUs Go runs on: GOMAXPROCS as the runtime chose it
// (or the GOMAXPROCS variable set it), before spareProcs raises it.
var cpus = runtime.GOMAXPROCS(0)

// defaultWrites is how many calls that change containers run at once:
// twice the CPUs Go runs on, at least 4.
func defaultWrites() int { return max(4, 2*cpus) }

// boundWrites lets at most n calls that change containers (writeMethods)
// run at once; the others wait parked (not runnable) until a slot frees or
// their deadline passes. A burst of teardowns is CPU work (a retire sleeps
// in no RCU grace period): left unbounded, a drain of 1,000 puts 1,000
// runnable goroutines between a read (Get, List, Usage, Status: never
// bounded) and a CPU. Bounding also shortened drains (fewer goroutines
// contending for the same locks).
func boundWrites(n int) grpc.UnaryServerInterceptor {
	slots := make(chan struct{}, n)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !writeMethods[info.FullMethod] {
			return handler(ctx, req)
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		defer func() { <-slots }()
		return handler(ctx, req)
	}
}
