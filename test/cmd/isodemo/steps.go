package main

// The demo's steps, in the order run calls them: sandbox, daemon,
// containers, isolate, list, reach, spread, ip netns exec, metrics,
// restart.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/traffic"
	"github.com/isolatord/isolatord/test/wait"
)

func (d *demo) stepSandbox(ctx context.Context) error {
	for _, p := range []string{"nsenter", "ip", "ss", "tc"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s not found (make deps installs it): %w", p, err)
		}
	}
	bin, err := filepath.Abs(d.opts.bin)
	if err != nil {
		return err
	}
	for _, b := range []string{"isolatord", "isolatorctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("%s not built (run make build): %w", b, err)
		}
	}
	if _, err := os.Stat(d.opts.isotraffic); err != nil {
		return fmt.Errorf("isotraffic binary (--isotraffic): %w", err)
	}
	d.ctl = filepath.Join(bin, "isolatorctl")
	if d.tmp, err = os.MkdirTemp("", "isodemo-"); err != nil {
		return err
	}
	d.socket = filepath.Join(d.tmp, "isolatord.sock")
	if d.sb, err = sandbox.NewNamed("isodemo"); err != nil {
		return err
	}
	// NewNamed deleted the namespaces of sandboxes whose owner died; remove
	// the container handles such a demo left too.
	if n := sweepStaleDemoMounts(); n > 0 {
		d.ui.linef("   (removed %d namespace handle(s) left by an earlier demo that was killed)", n)
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPLAYS\tADDRESS ON ITS eth0")
	fmt.Fprintf(tw, "%s\tthe machine isolatord runs on\t%s/24\n", d.sb.Host.Name, d.sb.HostIP)
	fmt.Fprintf(tw, "%s\tthe outside world (a client)\t%s/24\n", d.sb.Client.Name, d.sb.ClientIP)
	tw.Flush()
	d.ui.block(b.String())
	return nil
}

func (d *demo) stepDaemon(ctx context.Context) error {
	bin, _ := filepath.Abs(d.opts.bin)
	d.d = &daemon{
		Bin:    filepath.Join(bin, "isolatord"),
		HostNS: d.sb.Host.Path,
		Args: []string{
			"--socket", d.socket,
			"--state-dir", filepath.Join(d.tmp, "state"),
			"--lock-dir", filepath.Join(d.tmp, "lock"),
			"--netns-dir", netnsDir,
			"--ports", managedPorts,
			"--ephemeral-ports", ephemeralPool,
			"--ephemeral-ports-per-container", strconv.Itoa(blockSize),
			"--metrics-addr", metricsAddr,
		},
	}
	d.ui.command(append([]string{"nsenter", "--net=" + d.sb.Host.Path, "isolatord"}, d.d.Args...)...)
	took, err := d.d.Start(daemonStartMax)
	if err != nil {
		return err
	}
	d.ui.linef("   serving after %s (pid %d); the isolatorctl commands below pass --socket %s (left out here)", round(took), d.d.Pid(), d.socket)
	if hs, err := readHostState(d.sb); err == nil {
		d.baseline, d.hasBase = hs, true
	}
	d.ui.command("isolatorctl", "status")
	out, err := d.isolatorctl(ctx, "status")
	if err != nil {
		return err
	}
	d.ui.block(out)
	return nil
}

func (d *demo) stepContainers(ctx context.Context) error {
	d.ctrs = []*ctr{
		{name: "alpha", port: 31001},
		{name: "beta", port: sharedPort, shared: true},
		{name: "gamma", port: sharedPort, shared: true},
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tPID\tSERVES (TCP and UDP)\tNOTE")
	for _, c := range d.ctrs {
		c.id = d.sb.Name + "-" + c.name
		addr := ":" + strconv.Itoa(c.port)
		argv := []string{d.opts.isotraffic, "serve", "--tcp", addr, "--udp", addr, "--name", c.name}
		note := "port of its own"
		if c.shared {
			argv = append(argv, "--reuseport")
			note = "shared port (SO_REUSEPORT)"
		}
		sc, err := d.sb.Spawn(c.name, argv...)
		if err != nil {
			return fmt.Errorf("start %s: %w", c.name, err)
		}
		c.c = sc
		if err := sc.WaitOutput("ready", 10*time.Second); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", c.name, sc.Pid, c.port, note)
	}
	tw.Flush()
	d.ui.block(b.String())
	return nil
}

func (d *demo) stepIsolate(ctx context.Context) error {
	for _, c := range d.ctrs {
		flag := "--ports"
		if c.shared {
			flag = "--shared-ports"
		}
		t0 := time.Now()
		for _, argv := range [][]string{
			{"prepare", c.id, flag, strconv.Itoa(c.port)},
			{"isolate", c.id, "--pid", strconv.Itoa(c.c.Pid)},
		} {
			d.ui.command(append([]string{"isolatorctl"}, argv...)...)
			if _, err := d.isolatorctl(ctx, argv...); err != nil {
				return err
			}
		}
		d.ui.linef("     -> %s prepared and isolated in %s", c.name, round(time.Since(t0)))
	}
	return nil
}

// ctlContainer is isolatorctl's JSON for a container (the fields we use).
type ctlContainer struct {
	ContainerID    string `json:"container_id"`
	State          string `json:"state"`
	EphemeralPorts *struct {
		Begin int `json:"begin"`
		End   int `json:"end"`
	} `json:"ephemeral_ports"`
	Ports []struct {
		Begin  int  `json:"begin"`
		End    int  `json:"end"`
		Shared bool `json:"shared"`
	} `json:"ports"`
	Veth  string `json:"veth"`
	Netns string `json:"netns"`
}

// listContainers returns the daemon's containers keyed by ID.
func (d *demo) listContainers(ctx context.Context) (map[string]ctlContainer, error) {
	out, err := d.isolatorctl(ctx, "-o", "json", "list")
	if err != nil {
		return nil, err
	}
	var list []ctlContainer
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		// Accept an object wrapping the list too.
		var wrapped struct {
			Containers []ctlContainer `json:"containers"`
		}
		if err2 := json.Unmarshal([]byte(out), &wrapped); err2 != nil {
			return nil, fmt.Errorf("isolatorctl -o json list: %v; output:\n%s", err, out)
		}
		list = wrapped.Containers
	}
	m := map[string]ctlContainer{}
	for _, c := range list {
		m[c.ContainerID] = c
	}
	return m, nil
}

// checkAllIsolated checks that the daemon lists every demo container as
// isolated, owning its port.
func (d *demo) checkAllIsolated(ctx context.Context) error {
	m, err := d.listContainers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range d.ctrs {
		got, ok := m[c.id]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s is not listed", c.id))
		case got.State != "isolated":
			errs = append(errs, fmt.Errorf("%s is %q, want isolated", c.id, got.State))
		case len(got.Ports) != 1 || got.Ports[0].Begin != c.port || got.Ports[0].Shared != c.shared:
			errs = append(errs, fmt.Errorf("%s has ports %+v, want %d (shared=%v)", c.id, got.Ports, c.port, c.shared))
		case got.EphemeralPorts == nil || got.EphemeralPorts.End-got.EphemeralPorts.Begin+1 != blockSize:
			errs = append(errs, fmt.Errorf("%s has ephemeral ports %+v, want a block of %d", c.id, got.EphemeralPorts, blockSize))
		}
	}
	return errors.Join(errs...)
}

func (d *demo) stepList(ctx context.Context) error {
	d.ui.command("isolatorctl", "list")
	out, err := d.isolatorctl(ctx, "list")
	if err != nil {
		return err
	}
	d.ui.block(out)
	return d.checkAllIsolated(ctx)
}

// echo sends one request from the client namespace to the host's IP and
// returns the name of the server that answered.
func (d *demo) echo(ctx context.Context, network string, port int, msg string) (string, error) {
	var reply string
	addr := net.JoinHostPort(d.sb.HostIP.String(), strconv.Itoa(port))
	err := d.sb.Client.Do(func() (err error) {
		reply, err = traffic.Echo(ctx, network, addr, msg, traffic.WithTimeout(2*time.Second))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s %s from the client: %w", network, addr, err)
	}
	return traffic.ReplyName(reply), nil
}

func (d *demo) stepReach(ctx context.Context) error {
	type probe struct {
		network string
		port    int
		want    []string
	}
	probes := []probe{
		{"tcp", 31001, []string{"alpha"}},
		{"udp", 31001, []string{"alpha"}},
		{"tcp", sharedPort, []string{"beta", "gamma"}},
		{"udp", sharedPort, []string{"beta", "gamma"}},
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT SENDS TO\tPROTO\tANSWERED BY\tEXPECTED\t")
	var errs []error
	for _, p := range probes {
		got, err := d.echo(ctx, p.network, p.port, "hello")
		mark := "ok"
		ans := got
		if err != nil {
			ans, mark = "(no answer)", "FAIL"
			errs = append(errs, err)
		} else if !contains(p.want, got) {
			mark = "FAIL"
			errs = append(errs, fmt.Errorf("%s to port %d answered by %q, want %s", p.network, p.port, got, strings.Join(p.want, " or ")))
		}
		fmt.Fprintf(tw, "%s:%d\t%s\t%s\t%s\t%s\n", d.sb.HostIP, p.port, p.network, ans, strings.Join(p.want, " or "), mark)
	}
	tw.Flush()
	d.ui.block(b.String())
	return errors.Join(errs...)
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func (d *demo) stepSpread(ctx context.Context) error {
	counts := map[string]int{}
	var errs []error
	for i := 0; i < spreadConns && ctx.Err() == nil; i++ {
		got, err := d.echo(ctx, "tcp", sharedPort, "conn-"+strconv.Itoa(i))
		if err != nil {
			errs = append(errs, err)
			counts["(no answer)"]++
			continue
		}
		counts[got]++
	}
	labels := []string{"beta", "gamma"}
	for k := range counts {
		if !contains(labels, k) {
			labels = append(labels, k)
		}
	}
	d.ui.linef("     %d TCP connections to %s:%d, by the container that answered:", spreadConns, d.sb.HostIP, sharedPort)
	d.ui.block(histogram(labels, counts, 30))
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d connections failed; first: %w", len(errs), spreadConns, errs[0])
	}
	for _, l := range labels {
		if l != "beta" && l != "gamma" {
			return fmt.Errorf("%d connection(s) answered by %q, which does not hold port %d", counts[l], l, sharedPort)
		}
	}
	if counts["beta"] == 0 || counts["gamma"] == 0 {
		return fmt.Errorf("the shared port did not spread: beta got %d, gamma %d of %d connections", counts["beta"], counts["gamma"], spreadConns)
	}
	return nil
}

func (d *demo) stepNetnsExec(ctx context.Context) error {
	var errs []error
	for _, c := range d.ctrs {
		argv := []string{"ip", "netns", "exec", c.id, "ss", "-ltn"}
		d.ui.command(argv...)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(cctx, argv[0], argv[1:]...).CombinedOutput()
		cancel()
		d.ui.block(string(out))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", strings.Join(argv, " "), err))
			continue
		}
		if !strings.Contains(string(out), ":"+strconv.Itoa(c.port)) {
			errs = append(errs, fmt.Errorf("ss in %s does not list port %d", c.id, c.port))
		}
	}
	return errors.Join(errs...)
}

// scrapeMetrics fetches /metrics from the daemon's endpoint in the sandbox
// host namespace. The socket is opened on a thread inside that namespace
// (an http.Client would dial from another thread, in the wrong namespace);
// the request then runs over it from here.
func (d *demo) scrapeMetrics(ctx context.Context) (string, error) {
	var conn net.Conn
	err := d.sb.Host.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", metricsAddr, 2*time.Second)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("connect to the metrics endpoint %s in %s: %w (is --metrics-addr served?)", metricsAddr, d.sb.Host.Name, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return "", fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return "", fmt.Errorf("GET /metrics: reading the body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s: %s", resp.Status, firstLine(body.String()))
	}
	return body.String(), nil
}

func (d *demo) stepMetrics(ctx context.Context) error {
	d.ui.command("curl", "-s", "http://"+metricsAddr+"/metrics", "  # from inside the sandbox host")
	body, err := d.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	// Show one sample from each of a few isolatord_ families, preferring
	// lines about our containers.
	families := map[string]bool{}
	var picked []string
	lines := strings.Split(body, "\n")
	for pass := 0; pass < 2 && len(picked) < 8; pass++ {
		for _, l := range lines {
			if !strings.HasPrefix(l, "isolatord_") {
				continue
			}
			fam := l
			if i := strings.IndexAny(l, "{ "); i > 0 {
				fam = l[:i]
			}
			fam = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(fam, "_bucket"), "_sum"), "_count")
			if families[fam] || (pass == 0 && !strings.Contains(l, d.sb.Name)) {
				continue
			}
			families[fam] = true
			picked = append(picked, l)
			if len(picked) == 8 {
				break
			}
		}
	}
	all := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "isolatord_") {
			all++
		}
	}
	if len(picked) == 0 {
		return fmt.Errorf("the endpoint answered (%d bytes) but exports no isolatord_ metric", len(body))
	}
	d.ui.block(strings.Join(picked, "\n"))
	d.ui.linef("     ... %d isolatord_ samples in all", all)
	return nil
}

// waitSent waits (at most 10 s) until the client has sent n requests.
func waitSent(sent *atomic.Int64, n int64) error {
	if !wait.Until(10*time.Second, func() bool { return sent.Load() >= n }) {
		return fmt.Errorf("the client sent %d requests in 10 s, want %d", sent.Load(), n)
	}
	return nil
}

func (d *demo) stepRestart(ctx context.Context) error {
	// Client traffic: alternate TCP requests to alpha and to the shared
	// port, every 10 ms, until told to stop.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	tctx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100000 && tctx.Err() == nil; i++ {
			port := 31001
			if i%2 == 1 {
				port = sharedPort
			}
			sent.Add(1)
			if _, err := d.echo(ctx, "tcp", port, "during-restart"); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			select {
			case <-tctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() { stopTraffic(); wg.Wait() }()

	// Let the client's requests flow before the kill.
	if err := waitSent(&sent, 20); err != nil {
		return err
	}
	pid := d.d.Pid()
	d.ui.command("kill", "-9", strconv.Itoa(pid))
	killedAt := time.Now()
	if err := d.d.Stop(syscall.SIGKILL); err != nil {
		return err
	}
	d.ui.linef("     isolatord is gone; the client keeps sending requests every 10 ms")
	if err := waitSent(&sent, sent.Load()+20); err != nil {
		return err
	}
	d.ui.command(append([]string{"nsenter", "--net=" + d.sb.Host.Path, "isolatord"}, "...same flags...")...)
	took, err := d.d.Start(daemonStartMax)
	if err != nil {
		return err
	}
	down := time.Since(killedAt)
	d.ui.linef("     serving again after %s (pid %d); down for %s in all", round(took), d.d.Pid(), round(down))
	for _, l := range strings.Split(d.d.Log(), "\n") {
		if strings.Contains(l, `"msg":"recovered"`) || strings.Contains(l, `"msg":"recovery complete"`) {
			d.ui.block("log: " + l)
		}
	}
	if err := waitSent(&sent, sent.Load()+20); err != nil {
		return err
	}
	stopTraffic()
	wg.Wait()
	d.ui.linef("     requests sent during the restart window: %d, failed: %d", sent.Load(), failed.Load())
	var errs []error
	if sent.Load() == 0 {
		errs = append(errs, errors.New("no request was sent during the restart"))
	}
	if n := failed.Load(); n > 0 {
		errs = append(errs, fmt.Errorf("%d of %d requests failed around the restart; first: %v", n, sent.Load(), firstErr.Load()))
	}
	if err := d.checkAllIsolated(ctx); err != nil {
		errs = append(errs, fmt.Errorf("after the restart: %w", err))
	} else {
		d.ui.linef("     after the restart isolatorctl list still shows all %d containers isolated", len(d.ctrs))
	}
	return errors.Join(errs...)
}

// isolatorctl runs isolatorctl against the demo's daemon and returns its
// stdout; the error carries its stderr.
func (d *demo) isolatorctl(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, d.ctl, append([]string{"--socket", d.socket, "--timeout", "15s"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errOut.String())
		if msg == "" {
			msg = err.Error()
		}
		return out.String(), fmt.Errorf("isolatorctl %s: %s", strings.Join(args, " "), msg)
	}
	return out.String(), nil
}
