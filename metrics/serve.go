package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Serve serves h at /metrics on the TCP address addr (host:port; the
// daemon's default is 127.0.0.1:9617) until ctx ends or stop is called.
// addr "" disables it: Serve returns a no-op stop and boundAddr "". boundAddr
// is the address actually bound (useful with port 0). stop shuts the server
// down, waiting up to 5s for in-flight scrapes, and may be called more than
// once. A listen error is returned at once; an error while serving is
// logged.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (stop func(), boundAddr string, err error) {
	if addr == "" {
		return func() {}, "", nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<html><head><title>isolatord</title></head><body><h1>isolatord</h1><p><a href="/metrics">metrics</a></p></body></html>`+"\n")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "addr", lis.Addr().String(), "err", err.Error())
		}
	}()
	var once sync.Once
	shutdown := func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
		})
		<-done
	}
	go func() {
		select {
		case <-ctx.Done():
			shutdown()
		case <-done:
		}
	}()
	log.Info("serving metrics", "addr", lis.Addr().String(), "path", "/metrics")
	return shutdown, lis.Addr().String(), nil
}
