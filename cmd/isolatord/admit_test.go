package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/test/wait"
)

// TestBoundWrites: at most n writes run at once, reads pass while every
// slot is held, a write waiting past its deadline fails with
// DeadlineExceeded and never runs, and every queued write runs once slots
// free.
func TestBoundWrites(t *testing.T) {
	const n = 3
	bound := boundWrites(n)
	release := make(chan struct{})
	var running, most, ran atomic.Int32
	write := func(ctx context.Context, _ any) (any, error) {
		r := running.Add(1)
		for {
			m := most.Load()
			if r <= m || most.CompareAndSwap(m, r) {
				break
			}
		}
		<-release
		running.Add(-1)
		ran.Add(1)
		return nil, nil
	}
	cleanup := &grpc.UnaryServerInfo{FullMethod: pbgrpc.Isolator_Cleanup_FullMethodName}
	var wg sync.WaitGroup
	const writers = 10
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := bound(context.Background(), nil, cleanup, write); err != nil {
				t.Error(err)
			}
		}()
	}
	if !wait.Until(10*time.Second, func() bool { return running.Load() >= n }) {
		t.Fatalf("%d writes running, want %d", running.Load(), n)
	}

	// Every slot held: a read passes at once.
	for _, m := range []string{pbgrpc.Isolator_Get_FullMethodName, pbgrpc.Isolator_Usage_FullMethodName, pbgrpc.Isolator_List_FullMethodName} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := bound(ctx, nil, &grpc.UnaryServerInfo{FullMethod: m}, func(context.Context, any) (any, error) { return "read", nil })
		cancel()
		if err != nil {
			t.Fatalf("%s while the writes hold every slot: %v", m, err)
		}
	}
	// A write whose deadline passes while waiting fails and never runs.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err := bound(ctx, nil, &grpc.UnaryServerInfo{FullMethod: pbgrpc.Isolator_Prepare_FullMethodName},
		func(context.Context, any) (any, error) { t.Error("a write ran past its deadline"); return nil, nil })
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("waiting write past its deadline: %v, want DeadlineExceeded", err)
	}

	close(release)
	wg.Wait()
	if got := ran.Load(); got != writers {
		t.Fatalf("%d writes ran, want %d", got, writers)
	}
	if got := most.Load(); got != n {
		t.Fatalf("at most %d writes ran at once, want %d", got, n)
	}
}
