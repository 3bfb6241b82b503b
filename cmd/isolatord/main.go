// Command isolatord is the isolatord daemon: it gives containers network
// isolation while they share the host's IP address, and is driven over gRPC on
// a unix socket (see api/isolatord/v1/isolator.proto).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"github.com/isolatord/isolatord/metrics"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/isolatord/isolatord/netns/sysctl"
	"github.com/isolatord/isolatord/tcfilter"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type options struct {
	socket, stateDir, metricsAddr string
	lockDir                       string
	eth0, lo, netnsDir, hostNetNS string
	ports, ephemeralPorts         string
	blockSize                     int
	fragTableSize                 int
	allowUIDs                     string
	logLevel                      string
	config                        string // the --config file of the settings that change at run time (reload.go)
	shutdownTimeout               time.Duration
	metricsPerContainer           bool
	orphanGrace                   time.Duration
	// default bandwidth limits: rates, bursts and ceils as typed
	egressRate, egressBurst, egressCeil    string
	ingressRate, ingressBurst, ingressCeil string
	ipv6                                   ipv6Flag
	followHost                             bool
	hostLoopbackPorts                      string // host loopback ports open to every container (loopback)
	dockerPlugin                           string // socket of the Docker network driver ("" = none; docker.go)
	showVersion                            bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// flagSet defines isolatord's flags into o.
func flagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("isolatord", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.config, "config", "", "file of the settings that change at run time (key=value lines: log-level, allow-uid, host-loopback-ports and the default limits, named like their flags, which stay their defaults); SIGHUP reads it again")
	fs.StringVar(&o.socket, "socket", "/run/isolatord/isolatord.sock", "unix socket to serve gRPC on")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/isolatord", "directory of the state database")
	fs.StringVar(&o.lockDir, "lock-dir", "/run/isolatord", "directory of the per-host-namespace lock file (one daemon per host network namespace)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9617", "address to serve Prometheus /metrics on (empty disables)")
	fs.StringVar(&o.eth0, "eth0", "", "public interface (default: the device of the default route)")
	fs.StringVar(&o.lo, "lo", "", "loopback interface (default: the first loopback link)")
	fs.StringVar(&o.ports, "ports", "", "static ports containers may ask for, e.g. 31000-31999")
	fs.StringVar(&o.ephemeralPorts, "ephemeral-ports", "", "pool of ephemeral ports handed out in per-container blocks, e.g. 32768-49151 (required)")
	fs.IntVar(&o.blockSize, "ephemeral-ports-per-container", 1024, "ephemeral block size: a power of two >= 16")
	fs.StringVar(&o.netnsDir, "netns-dir", "/var/run/netns", "directory of the namespace bind mounts (ip netns uses /var/run/netns)")
	fs.StringVar(&o.allowUIDs, "allow-uid", "0", "comma-separated uids allowed to call the API")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.hostNetNS, "host-netns", "", "run the host side inside this network namespace (path; for sandboxes)")
	fs.BoolVar(&o.metricsPerContainer, "metrics-per-container", false, "export per-container traffic series (label container_id; off by default: cardinality)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long SIGTERM waits for in-flight calls")
	fs.DurationVar(&o.orphanGrace, "orphan-grace", isolator.DefaultOrphanGrace, "clean up a container whose namespace has had no process and no pin but isolatord's own for this long (removed by a runtime without a CNI DEL); 0 disables")
	fs.StringVar(&o.egressRate, "egress-rate-limit", "0", "default limit on what each container sends, enforced on the host side: bytes per second or a rate such as 10MB/s, 10MiB/s, 100Mbit (0 = none); Prepare may give its own")
	fs.StringVar(&o.egressBurst, "egress-burst", "0", "burst of the default egress limit, bytes or a size such as 256KiB (0 = 10 ms at the rate, at least 64KiB)")
	fs.StringVar(&o.egressCeil, "egress-ceil", "0", "peak rate of the default egress limit while bursting (0 = line speed)")
	fs.StringVar(&o.ingressRate, "ingress-rate-limit", "0", "default limit on what each container receives, like --egress-rate-limit")
	fs.StringVar(&o.ingressBurst, "ingress-burst", "0", "burst of the default ingress limit, like --egress-burst")
	fs.StringVar(&o.ingressCeil, "ingress-ceil", "0", "peak rate of the default ingress limit while bursting (0 = line speed)")
	fs.BoolVar(&o.followHost, "follow-host", true, "follow the host interface at run time: containers get the host's new addresses, gateways, MTU and MAC within seconds, and a recreated interface its filters again")
	fs.StringVar(&o.hostLoopbackPorts, keyHostLoopbackPorts, "", "ports of host services on 127.0.0.0/8 and ::1 every container may reach, e.g. 53,8125 (default none: a container reaches no host-only service; containers still reach each other through 127.0.0.1)")
	fs.IntVar(&o.fragTableSize, "fragment-table-size", 0, "datagrams per family whose later fragments are steered to the container their first fragment went to (0 = 8192; negative = off: later fragments stay with the host)")
	fs.StringVar(&o.dockerPlugin, "docker-plugin", "", "serve Docker's remote network driver on this unix socket, e.g. /run/docker/plugins/isolator.sock (the file name is the driver's name; empty disables; docs/docker.md)")
	fs.BoolVar(&o.showVersion, "version", false, "print isolatord's version and exit")
	fs.Var(&o.ipv6, "ipv6", "containers share the host's IPv6 addresses: true, false, or auto (the default: on when the host interface has a global IPv6 address)")
	return fs
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "isolatord:", err)
		return 2
	}
	if o.showVersion {
		fmt.Println("isolatord", version)
		return 0
	}
	flags := o
	o, fixed, err := applyConfigFile(flags)
	if err != nil {
		fmt.Fprintln(stderr, "isolatord:", err)
		return 2
	}
	live, err := o.live()
	if err != nil {
		fmt.Fprintln(stderr, "isolatord:", err)
		return 2
	}
	level := new(slog.LevelVar)
	level.Set(live.level)
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	for _, k := range fixed {
		logFixed(log, o.config, k)
	}
	rl := &reloader{flags: flags, log: log, level: level, uids: newUIDSet(live.uids), cur: live}
	if err := serve(o, log, rl); err != nil {
		log.Error("isolatord failed", "err", err.Error())
		return 1
	}
	return 0
}

// config turns flags into the lifecycle configuration, refusing bad values
// with one clear error.
func config(o *options, log *slog.Logger) (isolator.Config, []uint32, error) {
	var cfg isolator.Config
	managed, err := ephemeral.ParseSet(o.ports)
	if err != nil {
		return cfg, nil, fmt.Errorf("--ports: %w", err)
	}
	if o.ephemeralPorts == "" {
		return cfg, nil, errors.New("--ephemeral-ports is required (e.g. --ephemeral-ports 32768-49151), and must not overlap the host's ip_local_port_range")
	}
	pool, err := ephemeral.ParseSet(o.ephemeralPorts)
	if err != nil {
		return cfg, nil, fmt.Errorf("--ephemeral-ports: %w", err)
	}
	uids, err := parseUIDs(o.allowUIDs)
	if err != nil {
		return cfg, nil, err
	}
	egress, err := limitFlags("egress", o.egressRate, o.egressBurst, o.egressCeil)
	if err != nil {
		return cfg, nil, err
	}
	ingress, err := limitFlags("ingress", o.ingressRate, o.ingressBurst, o.ingressCeil)
	if err != nil {
		return cfg, nil, err
	}
	if err := checkFragTableSize(o.fragTableSize); err != nil {
		return cfg, nil, err
	}
	hostLocal, err := readHostLocalRange(o.hostNetNS)
	if err != nil {
		return cfg, nil, fmt.Errorf("read the host's ip_local_port_range: %w", err)
	}
	cfg = isolator.Config{
		ManagedPorts:  managed,
		EphemeralPool: pool,
		BlockSize:     o.blockSize,
		HostLocal:     hostLocal,
		StateDir:      o.stateDir,
		Version:       version,
		Logger:        log,
	}
	cfg.Egress, cfg.Ingress = egress, ingress
	return cfg, uids, nil
}

// parseUIDs parses --allow-uid: comma-separated uids, at least one.
func parseUIDs(s string) ([]uint32, error) {
	var uids []uint32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		u, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--allow-uid: %q is not a uid", f)
		}
		uids = append(uids, uint32(u))
	}
	if len(uids) == 0 {
		return nil, errors.New("--allow-uid: at least one uid is required")
	}
	return uids, nil
}

// limitFlags parses the default limit of one direction from its flags
// (--DIR-rate-limit, --DIR-burst, --DIR-ceil). The link speed is checked
// once the host is known (isolator.Start).
func limitFlags(dir, rateS, burstS, ceilS string) (rate.Limit, error) {
	var l rate.Limit
	var err error
	if l.Rate, err = rate.Parse(rateS); err != nil {
		return l, fmt.Errorf("--%s-rate-limit: %w", dir, err)
	}
	if l.Burst, err = rate.ParseSize(burstS); err != nil {
		return l, fmt.Errorf("--%s-burst: %w", dir, err)
	}
	if l.Ceil, err = rate.Parse(ceilS); err != nil {
		return l, fmt.Errorf("--%s-ceil: %w", dir, err)
	}
	if l.Rate == 0 && (l.Burst != 0 || l.Ceil != 0) {
		return l, fmt.Errorf("--%s-burst and --%s-ceil need --%s-rate-limit", dir, dir, dir)
	}
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("--%s-rate-limit %s, --%s-burst %s, --%s-ceil %s: %v", dir, rateS, dir, burstS, dir, ceilS, err)
	}
	return l, nil
}

// readHostLocalRange reads net.ipv4.ip_local_port_range of the host
// namespace (the daemon's own, or --host-netns).
func readHostLocalRange(hostNS string) (ephemeral.Range, error) {
	var v string
	read := func(sd *sysctl.Dir) (err error) { v, err = sd.Read("net/ipv4/ip_local_port_range"); return err }
	if hostNS == "" {
		if err := sysctl.Here(read); err != nil {
			return ephemeral.Range{}, err
		}
	} else {
		ns, err := nshandle.Open(hostNS)
		if err != nil {
			return ephemeral.Range{}, fmt.Errorf("--host-netns: %w", err)
		}
		err = sysctl.In(ns, read)
		ns.Close()
		if err != nil {
			return ephemeral.Range{}, err
		}
	}
	f := strings.Fields(v)
	if len(f) != 2 {
		return ephemeral.Range{}, fmt.Errorf("unexpected %q", v)
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 16)
	hi, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil {
		return ephemeral.Range{}, fmt.Errorf("unexpected %q", v)
	}
	return ephemeral.Range{Begin: uint16(lo), End: uint16(hi)}, nil
}

func serve(o *options, log *slog.Logger, rl *reloader) error {
	// Signals first (none ends the daemon without a log line), then the
	// host namespace's lock: before any state is read or the kernel touched.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	tuneGC(log)
	reloads := make(chan struct{}, 1)
	unwatch := watchSignals(log, stop, rl.flags.config != "", reloads)
	defer unwatch()
	lock, err := lockHostNS(o.lockDir, o.hostNetNS)
	if err != nil {
		return err
	}
	defer lock.release()

	cfg, _, err := config(o, log)
	if err != nil {
		return err
	}
	m := metrics.New(version)
	cfg.Observer = m
	hp, err := openHostPorts(o.hostNetNS)
	if err != nil {
		return err
	}
	defer hp.Close()
	cfg.HostPorts = hp
	dp, err := dataplane.New(dataplane.Config{HostNS: o.hostNetNS, Eth0: o.eth0, Lo: o.lo, NetNSDir: o.netnsDir, IPv6: o.ipv6.mode, Follow: o.followHost, Logger: log, Observer: m.FilterOp,
		ContainerPorts: cfg.ManagedPorts.Union(cfg.EphemeralPool), HostLoopbackPorts: rl.cur.loopback,
		FragmentTableSize: o.fragTableSize})
	if err != nil {
		return err
	}
	defer dp.Close()
	m.WatchNeighbours(dp.NeighStats)
	m.WatchFollower(dp.FollowStats)
	iso, err := isolator.New(cfg, dp)
	if err != nil {
		return err
	}
	defer iso.Close()
	m.WatchState(iso, o.metricsPerContainer)
	if err := reservePool(hp, cfg.EphemeralPool, cfg.StateDir, log); err != nil {
		return err
	}
	m.WatchDrops(dp, tcfilter.DropReasons)
	m.WatchIPv6ToHost(dp.IPv6ToHost)
	m.WatchFragments(fragmentMetrics(dp))
	m.WatchDrains(dp.DrainTotals)
	m.WatchRecovery(iso)

	// Metrics first, so that a long recovery is visible.
	stopMetrics, _, err := metrics.Serve(ctx, o.metricsAddr, m.Handler(), log)
	if err != nil {
		return err
	}
	defer stopMetrics()

	start := time.Now()
	rep, err := iso.Start(ctx)
	if err != nil && ctx.Err() != nil {
		log.Info("shut down during recovery; a restart completes it", "err", err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("recovery: %w", err)
	}
	log.Info("recovered", "duration_seconds", time.Since(start).Seconds(), "kept", rep.Kept, "rebuilt", len(rep.Rebuilt), "unattributed", len(rep.Unattributed))
	go iso.ReclaimOrphans(ctx, o.orphanGrace)

	if ctx.Err() != nil {
		log.Info("shut down before serving; container plumbing stays in place")
		return nil
	}
	lis, ownSocket, err := listen(o.socket, log)
	if err != nil {
		return err
	}
	if ownSocket { // a socket systemd passed stays: it queues calls for the next start
		defer os.Remove(o.socket)
	}
	gs, hs := newGRPCServer(iso, rl.uids, log, m, func() string { return dp.HostLoopbackPorts().String() }, fragmentStatus(dp))
	spareProcs(log)
	rl.iso = iso
	rl.loopback = func(s ephemeral.Set) error { return dp.SetHostLoopbackPorts(ctx, s) }
	rl.newUIDs = func(uids []uint32) { m.InitRPC(gs, uidLabels(uids)...) }
	go rl.serve(ctx, reloads)

	dockerDone, err := serveDocker(ctx, o, iso, dp, log)
	if err != nil {
		return err
	}
	defer dockerDone()

	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	if err := sdNotify("READY=1"); err != nil {
		log.Warn("sd_notify READY failed", "err", err.Error())
	}
	log.Info("serving", "socket", o.socket, "version", version, "pid", os.Getpid())

	select {
	case err := <-errc:
		gs.Stop()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing in-flight calls; container plumbing stays in place")
	_ = sdNotify("STOPPING=1")
	hs.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(o.shutdownTimeout):
		log.Warn("shutdown timeout: stopping in-flight calls")
		gs.Stop()
	}
	return nil
}

// newGRPCServer builds the gRPC server: peer-credential transport, uid
// authorization, call logging, the Isolator service and the health service.
func newGRPCServer(iso *isolator.Isolator, allowed *uidSet, log *slog.Logger, m *metrics.Metrics, loopback func() string, fragments ...fragmentsFn) (*grpc.Server, *health.Server) {
	// Metrics first, so refused calls count as PermissionDenied with the caller's uid.
	gs := grpc.NewServer(
		grpc.Creds(peerCreds{}),
		grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor(uidLabel), logCalls(log), authorize(allowed), boundWrites(defaultWrites())),
	)
	pbgrpc.RegisterIsolatorServer(gs, &server{iso: iso, log: log, loopback: loopback, fragments: fragments})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(pbgrpc.Isolator_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	m.InitRPC(gs, uidLabels(allowed.list())...)
	return gs, hs
}

// uidLabels are uids as the peer_uid label of the call metrics.
func uidLabels(uids []uint32) []string {
	out := make([]string, len(uids))
	for i, u := range uids {
		out[i] = strconv.FormatUint(uint64(u), 10)
	}
	return out
}

// listenUnix creates the socket's directory (0750) and the socket (0660),
// replacing a stale socket file but refusing to steal a live one.
func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	_, serr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if errors.Is(serr, fs.ErrNotExist) {
		// 0750 whatever the umask (the unit has UMask=0077).
		if err := os.Chmod(dir, 0o750); err != nil {
			return nil, fmt.Errorf("--socket: %w", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--socket: %s is in use: a process answers on it (an isolatord of another host network namespace, or another program)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--socket: remove stale %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	return lis, nil
}

// logCalls logs every call at debug level, and failures at info, with the
// caller's uid.
func logCalls(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		if err == nil && !log.Enabled(ctx, slog.LevelDebug) {
			return resp, err
		}
		attrs := []any{"method", info.FullMethod, "peer_uid", uidLabel(ctx), "duration_seconds", time.Since(start).Seconds()}
		if err != nil {
			log.Info("call failed", append(attrs, "err", err.Error())...)
		} else {
			log.Debug("call", attrs...)
		}
		return resp, err
	}
}
