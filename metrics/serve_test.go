package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/tcfilter"
)

func get(t *testing.T, url string) (int, string, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func TestServeScrapedOverHTTP(t *testing.T) {
	m := New("9.9.9")
	m.FilterOp(tcfilter.Op{Op: "add", Device: "lo", Kind: "ip", Result: "exists"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, addr, err := Serve(ctx, "127.0.0.1:0", m.Handler(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("bound address %q", addr)
	}

	code, ctype, body := get(t, "http://"+addr+"/metrics")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") {
		t.Fatalf("/metrics: %d %q", code, ctype)
	}
	f := parse(t, strings.NewReader(body))
	if v := f.value(t, "isolatord_filter_operations_total", "op", "add", "device", "lo", "kind", "ip", "result", "exists"); v != 1 {
		t.Errorf("add/lo/ip/exists = %v over HTTP, want 1", v)
	}
	if f.find("isolatord_build_info", "version", "9.9.9", "goversion", runtime.Version()) == nil {
		t.Errorf("build_info missing over HTTP")
	}
	// The handler counts its own scrapes.
	_, _, body = get(t, "http://"+addr+"/metrics")
	f = parse(t, strings.NewReader(body))
	if v := f.value(t, "promhttp_metric_handler_requests_total", "code", "200"); v < 1 {
		t.Errorf("promhttp_metric_handler_requests_total{code=200} = %v", v)
	}

	if code, _, body := get(t, "http://"+addr+"/"); code != http.StatusOK || !strings.Contains(body, `href="/metrics"`) {
		t.Errorf("/: %d %q", code, body)
	}
	if code, _, _ := get(t, "http://"+addr+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d, want 404", code)
	}

	stop()
	stop() // idempotent
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("still listening on %s after stop", addr)
	}
}

func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	stop, addr, err := Serve(ctx, "127.0.0.1:0", New("x").Handler(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	stop() // waits for the shutdown the cancel started
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("still listening on %s after the context ended", addr)
	}
}

func TestServeDisabledAndBadAddress(t *testing.T) {
	stop, addr, err := Serve(context.Background(), "", New("x").Handler(), nil)
	if err != nil || addr != "" || stop == nil {
		t.Fatalf(`Serve(""): stop=%v addr=%q err=%v, want a no-op`, stop != nil, addr, err)
	}
	stop()

	_, _, err = Serve(context.Background(), "127.0.0.1:99999", New("x").Handler(), nil)
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("bad port: err = %v, want an error naming --metrics-addr", err)
	}
	// A port in use is refused up front.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, _, err := Serve(context.Background(), l.Addr().String(), New("x").Handler(), nil); err == nil {
		t.Fatalf("Serve on a busy port succeeded")
	}
}
