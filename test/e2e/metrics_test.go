package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

const metricsAddr = "127.0.0.1:9617"

// scrape fetches /metrics from the daemon's listener in the sandbox host
// namespace (the socket is opened on a thread inside it) and parses it with
// the Prometheus exposition-format parser.
func scrape(t *testing.T, sb *sandbox.Sandbox) map[string]*dto.MetricFamily {
	t.Helper()
	var body []byte
	err := sb.Host.Do(func() error {
		c, err := net.DialTimeout("tcp", metricsAddr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\nHost: isolatord\r\nAccept: text/plain\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %s", resp.Status)
		}
		body, err = io.ReadAll(resp.Body)
		return err
	})
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels include
// all of want; it fails the test when no series matches.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric family %s", name)
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Untyped != nil:
			return m.Untyped.GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

// sumOf adds every series of name whose labels include want.
func sumOf(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f, ok := fams[name]
	if !ok {
		return 0
	}
	total := 0.0
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if match && m.Counter != nil {
			total += m.Counter.GetValue()
		}
	}
	return total
}

// TestMetricsScrape checks that /metrics values move with what the daemon
// does: the container gauge after isolate and cleanup, a filter removal
// counted as does-not-exist after the veth was deleted behind the daemon's
// back, RPC counters by code after a rejected request.
func TestMetricsScrape(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{Extra: []string{"--metrics-addr", metricsAddr}})
	ctx := context.Background()

	m0 := scrape(t, sb)
	if v := value(t, m0, "isolatord_containers", map[string]string{"state": "isolated"}); v != 0 {
		t.Fatalf("isolated containers at start: %v", v)
	}
	notFound0 := sumOf(m0, "isolatord_filter_operations_total", map[string]string{"op": "remove", "result": "not_found"})
	if _, ok := m0["isolatord_build_info"]; !ok {
		t.Fatal("no build info")
	}

	id := sb.Name + "-m1"
	c := startServer(t, sb, "m1", 31010)
	d.Ctl(t, "prepare", id, "--ports", "31010")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))
	m1 := scrape(t, sb)
	if v := value(t, m1, "isolatord_containers", map[string]string{"state": "isolated"}); v != 1 {
		t.Fatalf("isolated containers after isolate: %v", v)
	}
	if v := value(t, m1, "isolatord_ephemeral_blocks", map[string]string{"state": "used"}); v != 1 {
		t.Fatalf("used blocks after isolate: %v", v)
	}
	if v := sumOf(m1, "isolatord_filter_operations_total", map[string]string{"op": "add", "result": "ok"}); v == 0 {
		t.Fatal("no successful filter additions counted")
	}

	// A rejected request is counted by its code and the caller's uid.
	_, err := d.Client.Prepare(ctx, &pb.PrepareRequest{ContainerId: "bad/id"})
	if err == nil {
		t.Fatal("bad id accepted")
	}
	m2 := scrape(t, sb)
	if v := value(t, m2, "isolatord_rpc_requests_total", map[string]string{"method": "/isolatord.v1.Isolator/Prepare", "code": "InvalidArgument", "peer_uid": "0"}); v != 1 {
		t.Fatalf("rejected Prepare counted %v times", v)
	}

	// Delete the container's veth behind the daemon's back, then clean up.
	sb.Host.Run(t, "ip", "link", "del", plane.VethName(id))
	d.Ctl(t, "cleanup", id)
	m3 := scrape(t, sb)
	if v := value(t, m3, "isolatord_containers", map[string]string{"state": "isolated"}); v != 0 {
		t.Fatalf("isolated containers after cleanup: %v", v)
	}
	if v := sumOf(m3, "isolatord_filter_operations_total", map[string]string{"op": "remove", "result": "not_found"}); v <= notFound0 {
		t.Fatalf("filter removals of a deleted veth not counted as not_found (%v -> %v)", notFound0, v)
	}
}

// TestUsageCountsTraffic sends a known number of bytes to a container and
// sees them in Usage, with RTT percentiles during a live connection.
func TestUsageCountsTraffic(t *testing.T) {
	sb := sandbox.New(t)
	d := StartDaemon(t, sb, DaemonOptions{})
	ctx := context.Background()
	id := sb.Name + "-u1"
	c := startServer(t, sb, "u1", 31020)
	d.Ctl(t, "prepare", id, "--ports", "31020")
	d.Ctl(t, "isolate", id, "--pid", strconv.Itoa(c.Pid))

	u0, err := d.Client.Usage(ctx, &pb.UsageRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	// 64 UDP datagrams of 1000 bytes of payload each, one way, no reply
	// expected (the server answers, which adds to tx, not rx).
	const n, size = 64, 1000
	payload := strings.Repeat("x", size)
	err = sb.Client.Do(func() error {
		conn, err := net.Dial("udp", net.JoinHostPort(sb.HostIP.String(), "31020"))
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < n; i++ {
			if _, err := conn.Write([]byte(payload + "\n")); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The veth's counters and the namespace's SNMP catch up with the last
	// datagram asynchronously: wait until both count all of them.
	var u1 *pb.UsageResponse
	wait.For(t, 5*time.Second, "the usage counts the 64 datagrams", func() bool {
		u1, err = d.Client.Usage(ctx, &pb.UsageRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		return u1.Traffic.RxPackets-u0.Traffic.RxPackets >= n && u1.Snmp.GetUdp()["InDatagrams"] >= n
	})
	// Each datagram: payload + newline + 8 UDP + 20 IP + 14 Ethernet bytes.
	wantBytes := uint64(n * (size + 1 + 8 + 20 + 14))
	gotBytes := u1.Traffic.RxBytes - u0.Traffic.RxBytes
	gotPkts := u1.Traffic.RxPackets - u0.Traffic.RxPackets
	if gotPkts < n || gotBytes < wantBytes || gotBytes > wantBytes+4096 {
		t.Fatalf("container received %d bytes in %d packets, want %d bytes in >= %d packets", gotBytes, gotPkts, wantBytes, n)
	}
	if u1.EphemeralPorts.GetEnd()-u1.EphemeralPorts.GetBegin() != 255 {
		t.Fatalf("ephemeral range %v", u1.EphemeralPorts)
	}
	if u1.Snmp == nil || u1.Snmp.Udp["InDatagrams"] < n {
		t.Fatalf("SNMP Udp.InDatagrams: %v", u1.Snmp)
	}

	// A live TCP connection: RTT percentiles are non-zero.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sb.Client.Do(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(sb.HostIP.String(), "31020"))
			if err != nil {
				return err
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			for i := 0; i < 500; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				if _, err := io.WriteString(conn, "ping\n"); err != nil {
					return err
				}
				if _, err := r.ReadString('\n'); err != nil {
					return err
				}
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		})
	}()
	// Wait until sock_diag has RTT samples of the live connection.
	var u2 *pb.UsageResponse
	wait.For(t, 5*time.Second, "RTT figures of the live connection", func() bool {
		u2, err = d.Client.Usage(ctx, &pb.UsageRequest{ContainerId: id})
		if err != nil {
			close(stop)
			t.Fatal(err)
		}
		return u2.Tcp.GetRtt().GetP50Us() != 0 && u2.Tcp.GetActiveConnections() >= 1
	})
	close(stop)
	if derr := <-done; derr != nil {
		t.Fatalf("live connection: %v", derr)
	}
	if u2.Tcp == nil || u2.Tcp.Rtt == nil || u2.Tcp.Rtt.P50Us == 0 || u2.Tcp.Rtt.P99Us < u2.Tcp.Rtt.P50Us || u2.Tcp.ActiveConnections < 1 {
		t.Fatalf("TCP stats during a live connection: %+v", u2.Tcp)
	}
	out := d.Ctl(t, "usage", id)
	if !strings.Contains(out, "rtt") && !strings.Contains(out, "RTT") {
		t.Fatalf("isolatorctl usage shows no RTT:\n%s", out)
	}
}
