package main

// CNI ADD and DEL through libcni executing the isolator-cni binary exactly
// as a runtime does (process exec to result, the namespace held by a real
// process), and where that time goes: the same daemon work called directly
// on an open gRPC connection, and the plugin's exec alone (a VERSION call).
// The control phase measures them after its curve; `--only cni` measures
// them alone in a sandbox and daemon of their own. With --cni-before, an
// earlier build's plugin and CLI are measured beside them (cnibefore.go).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/cni/libcni"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	pbgrpc "github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// phaseCNI runs the CNI figures alone (--only cni); in a full run the
// control phase measures them.
func (b *bench) phaseCNI(ctx context.Context) error {
	if b.res.Control == nil {
		b.res.Control = &ControlScale{Namespaces: "each held by a process (sleep cloned into a fresh network namespace)"}
	}
	_, hs, cl, err := b.processSandbox(ctx, "isobench-k", "sk")
	if err != nil {
		return err
	}
	return b.cniFigures(ctx, cl, hs, filepath.Join(b.tmp, "sk", "isolatord.sock"), b.o.cycles)
}

// cniFigures times k CNI ADDs and DELs through libcni, which executes the
// isolator-cni binary as a runtime does, each on a fresh namespace held by
// a process. Interleaved with them, on another fresh namespace each, it
// times the daemon's part called directly through cl (Attach by path
// with the same port and labels, then Cleanup) and the plugin's bare
// process exec (libcni's VERSION call): what ADD and DEL cost beyond the
// daemon's work is the plugin's. It also times `isolatorctl list`, the
// CLI's start to its answer.
func (b *bench) cniFigures(ctx context.Context, cl pbgrpc.IsolatorClient, hs *holders, socket string, k int) error {
	bin, err := filepath.Abs(b.o.bin)
	if err != nil {
		return err
	}
	for _, exe := range []string{"isolator-cni", "isolatorctl"} {
		if _, err := os.Stat(filepath.Join(bin, exe)); err != nil {
			return fmt.Errorf("%s not built (make build): %w", exe, err)
		}
	}
	confDir := filepath.Join(b.tmp, "cni-conf")
	cacheDir := filepath.Join(b.tmp, "cni-cache")
	for _, d := range []string{confDir, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "isobench", "plugins": [{"type": "isolator-cni", "socket": %q, "capabilities": {"portMappings": true}}]}`, socket)
	if err := os.WriteFile(filepath.Join(confDir, "isobench.conflist"), []byte(conf), 0o644); err != nil {
		return err
	}
	list, err := libcni.LoadConfList(confDir, "isobench")
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, cacheDir, nil)
	before, err := newBeforeBuild(b.o.cniBefore, b.o.cniBeforeRev, cacheDir)
	if err != nil {
		return err
	}
	warm := 2
	var add, del, exe, ctl, addRPC, delRPC []time.Duration
	for i := 0; i < warm+k; i++ {
		// The earlier build's samples go first every other round, so that
		// neither build always follows the other.
		if before != nil && i%2 == 1 {
			if err := before.sample(ctx, b, list, hs, socket, "old"+strconv.Itoa(i), i >= warm); err != nil {
				return fmt.Errorf("attachment %d: %w", i, err)
			}
		}
		a, d, err := b.cniSample(ctx, cni, list, hs, "cni"+strconv.Itoa(i))
		if err != nil {
			return fmt.Errorf("attachment %d: %w", i, err)
		}
		ra, rd, err := b.cniDaemonSample(ctx, cl, hs, "rpc"+strconv.Itoa(i))
		if err != nil {
			return fmt.Errorf("direct calls %d: %w", i, err)
		}
		t0 := time.Now()
		if _, err := cni.GetVersionInfo(ctx, "isolator-cni"); err != nil {
			return fmt.Errorf("VERSION: %w", err)
		}
		e := time.Since(t0)
		t0 = time.Now()
		if out, err := exec.CommandContext(ctx, filepath.Join(bin, "isolatorctl"), "--socket", socket, "list").CombinedOutput(); err != nil {
			return fmt.Errorf("isolatorctl list: %w: %s", err, out)
		}
		l := time.Since(t0)
		if i >= warm {
			add, del, exe, ctl = append(add, a), append(del, d), append(exe, e), append(ctl, l)
			addRPC, delRPC = append(addRPC, ra), append(delRPC, rd)
		}
		if before != nil && i%2 == 0 {
			if err := before.sample(ctx, b, list, hs, socket, "old"+strconv.Itoa(i), i >= warm); err != nil {
				return fmt.Errorf("attachment %d: %w", i, err)
			}
		}
	}
	cs := b.res.Control
	cs.CNIAdd, cs.CNIDel = summarize(add), summarize(del)
	cs.CNIExec, cs.CNIAddRPC, cs.CNIDelRPC = summarize(exe), summarize(addRPC), summarize(delRPC)
	cs.CtlList = summarize(ctl)
	if before != nil {
		cs.CNIBefore = before.result(bin)
		b.logf("control: CNI before (%s): ADD %s, DEL %s, exec %s", before.rev, fmtMs(cs.CNIBefore.Add), fmtMs(cs.CNIBefore.Del), fmtMs(cs.CNIBefore.Exec))
	}
	b.logf("control: CNI ADD %s, DEL %s", fmtMs(cs.CNIAdd), fmtMs(cs.CNIDel))
	b.logf("control: CNI breakdown: %s", cs.cniBreakdown())
	return nil
}

// cniSample runs one CNI ADD and DEL on a fresh process-held namespace.
func (b *bench) cniSample(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, hs *holders, id string) (add, del time.Duration, err error) {
	pid, err := hs.spawn()
	if err != nil {
		return 0, 0, err
	}
	defer hs.kill(pid)
	rt := &libcni.RuntimeConf{
		ContainerID: id, NetNS: fmt.Sprintf("/proc/%d/ns/net", pid), IfName: "eth0",
		CapabilityArgs: map[string]any{"portMappings": []map[string]any{{"hostPort": ctlPort, "containerPort": ctlPort, "protocol": "tcp"}}},
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := cni.AddNetworkList(cctx, list, rt); err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	err = cni.DelNetworkList(cctx, list, rt)
	return t1.Sub(t0), time.Since(t1), err
}

// cniDaemonSample calls the daemon's part of a CNI ADD (Attach: Prepare
// with the plugin's labels and Isolate by namespace path) and of a DEL
// (Cleanup of a container with those labels) directly on a fresh
// process-held namespace.
func (b *bench) cniDaemonSample(ctx context.Context, cl pbgrpc.IsolatorClient, hs *holders, id string) (add, del time.Duration, err error) {
	pid, err := hs.spawn()
	if err != nil {
		return 0, 0, err
	}
	defer hs.kill(pid)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	labels := map[string]string{"cni.network": "isobench", "cni.ifname": "eth0"}
	t0 := time.Now()
	_, err = cl.Attach(cctx, &pb.AttachRequest{
		Prepare:       &pb.PrepareRequest{ContainerId: id, Ports: []*pb.PortRange{{Begin: ctlPort, End: ctlPort}}, Labels: labels},
		Target:        &pb.AttachRequest_NetnsPath{NetnsPath: fmt.Sprintf("/proc/%d/ns/net", pid)},
		RequireLabels: labels,
	})
	t1 := time.Now()
	if _, cerr := cl.Cleanup(cctx, &pb.CleanupRequest{ContainerId: id, RequireLabels: labels}); err == nil {
		err = cerr
	}
	return t1.Sub(t0), time.Since(t1), err
}

// cniBreakdown says where the CNI time goes: p50 of the plugin's exec to a
// VERSION result, and what ADD and DEL cost beyond the daemon's own work;
// and the p50 of `isolatorctl list`.
func (c *ControlScale) cniBreakdown() string {
	if c == nil || c.CNIAdd == nil || c.CNIAddRPC == nil || c.CNIExec == nil {
		return "n/a"
	}
	s := fmt.Sprintf("p50 plugin exec to VERSION result %s ms; ADD %s = daemon Attach %s + plugin %s ms; DEL %s = daemon Cleanup %s + plugin %s ms",
		fmtNum(c.CNIExec.P50Ms),
		fmtNum(c.CNIAdd.P50Ms), fmtNum(c.CNIAddRPC.P50Ms), fmtNum(c.CNIAdd.P50Ms-c.CNIAddRPC.P50Ms),
		fmtNum(c.CNIDel.P50Ms), fmtNum(c.CNIDelRPC.P50Ms), fmtNum(c.CNIDel.P50Ms-c.CNIDelRPC.P50Ms))
	if c.CtlList != nil {
		s += "; isolatorctl list " + fmtMs(c.CtlList)
	}
	return s
}
