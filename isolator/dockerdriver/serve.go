package dockerdriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// Listen creates the plugin socket at path (its directory 0755, the socket
// 0660), replacing a stale socket file but refusing a live one.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--docker-plugin: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--docker-plugin: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--docker-plugin: %s is in use: a process answers on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--docker-plugin: remove stale %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--docker-plugin: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("--docker-plugin: %w", err)
	}
	return lis, nil
}

// Serve serves the driver on lis until ctx ends, then stops (in-flight
// calls get a few seconds), removes the socket and stops the isolations
// still waiting.
func (d *Driver) Serve(ctx context.Context, lis net.Listener) error {
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		<-errc
	}
	d.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
