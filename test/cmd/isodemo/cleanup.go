package main

// Cleanup: the host namespace's state before and after, compared, and
// what the demo leaves (netns mounts) swept.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/test/sandbox"
	"github.com/isolatord/isolatord/test/wait"
)

// hostState is what isolatord may add to the sandbox host namespace.
type hostState struct {
	veths   []string // links whose name starts with plane.VethPrefix
	filters int      // tc filter lines on eth0 and lo ingress
	lines   []string // those lines, "<dev>: <line>"
}

func readHostState(sb *sandbox.Sandbox) (hostState, error) {
	var hs hostState
	out, err := sb.Host.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		return hs, fmt.Errorf("ip link show in %s: %v: %s", sb.Host.Name, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
			if strings.HasPrefix(name, plane.VethPrefix) {
				hs.veths = append(hs.veths, name)
			}
		}
	}
	for _, dev := range []string{"eth0", "lo"} {
		out, err := sb.Host.Command("tc", "filter", "show", "dev", dev, "ingress").CombinedOutput()
		if err != nil {
			// No ingress qdisc: no filters.
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "filter ") {
				hs.filters++
				hs.lines = append(hs.lines, dev+": "+l)
			}
		}
	}
	sort.Strings(hs.veths)
	return hs, nil
}

// cleanup undoes everything the demo did and checks that nothing is left. It
// reports every problem it met; it never stops half-way.
func (d *demo) cleanup(ctx context.Context) error {
	var problems []string
	note := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT")
	row := func(check string, ok bool, detail string) {
		res := "ok"
		if !ok {
			res = "LEFT OVER"
		}
		if detail != "" {
			res += " (" + detail + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\n", check, res)
	}

	// 1. Each container through the API.
	if d.d != nil && d.d.Pid() != 0 {
		for _, c := range d.ctrs {
			if c.id == "" {
				continue
			}
			d.ui.command("isolatorctl", "cleanup", c.id)
			if _, err := d.isolatorctl(ctx, "cleanup", c.id); err != nil && !strings.Contains(err.Error(), "NotFound") {
				note("%v", err)
			}
		}
	} else if d.d != nil {
		note("isolatord was not running, so the containers could not be cleaned up through it")
	}

	// 2. The sandbox host has no veth and no filter rule of ours left. The
	// data plane deletes a hash table that became empty a little later
	// (the kernel keeps it busy for some milliseconds after its last
	// link goes): such tables hold no rule, route nothing, and must be
	// gone once isolatord has stopped.
	pendingTables := false
	if d.sb != nil && d.d != nil {
		hs, err := d.settledHostState(time.Second)
		if err != nil {
			note("%v", err)
		} else {
			row("veths in the sandbox host", len(hs.veths) == 0, strings.Join(hs.veths, ", "))
			if len(hs.veths) > 0 {
				note("veths left in %s: %s", d.sb.Host.Name, strings.Join(hs.veths, ", "))
			}
			if d.hasBase {
				rules, tables := splitTables(newLines(d.baseline.lines, hs.lines, 1000))
				row("tc filter rules on the host's eth0/lo", len(rules) == 0, fmt.Sprintf("%d beyond the %d from before the containers", len(rules), d.baseline.filters))
				if len(rules) > 0 {
					note("%d tc filter rules left on the sandbox host's eth0/lo ingress after cleanup, e.g.:\n%s", len(rules), strings.Join(first(rules, 8), "\n"))
				}
				if len(tables) > 0 {
					pendingTables = true
					row("empty hash tables", true, fmt.Sprintf("%d awaiting deferred deletion", len(tables)))
				}
			}
		}
	}

	// 3. Stop the daemon, the containers and the sandbox.
	if d.d != nil {
		if pid := d.d.Pid(); pid != 0 {
			d.ui.command("kill", "-TERM", strconv.Itoa(pid))
			if err := d.d.Stop(syscall.SIGTERM); err != nil {
				note("%v", err)
			}
		}
	}
	if pendingTables {
		if hs, err := readHostState(d.sb); err != nil {
			note("%v", err)
		} else {
			extra := newLines(d.baseline.lines, hs.lines, 1000)
			row("tc filters after isolatord stopped", len(extra) == 0, fmt.Sprintf("%d beyond the %d from before the containers", len(extra), d.baseline.filters))
			if len(extra) > 0 {
				note("%d tc filter lines left on the sandbox host's eth0/lo ingress after isolatord stopped, e.g.:\n%s", len(extra), strings.Join(first(extra, 8), "\n"))
			}
		}
	}
	var pids []int
	for _, c := range d.ctrs {
		if c.c != nil {
			pids = append(pids, c.c.Pid)
		}
	}
	if d.d != nil && d.d.LastPid() != 0 {
		pids = append(pids, d.d.LastPid())
	}
	// Namespace mounts of our containers that the cleanup did not remove
	// are removed here (so nothing stays behind) but reported.
	for _, c := range d.ctrs {
		if c.id == "" {
			continue
		}
		p := filepath.Join(netnsDir, c.id)
		if _, err := os.Lstat(p); err == nil {
			note("%s was still there after cleanup (removed now)", p)
			removeNetnsMount(p)
		}
	}
	if d.sb != nil {
		if err := d.sb.Close(); err != nil {
			note("sandbox teardown: %v", err)
		}
	}

	// 4. Nothing of the demo is left on the machine.
	if d.sb != nil {
		out, err := exec.CommandContext(ctx, "ip", "netns", "list").CombinedOutput()
		var ours []string
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], d.sb.Name) {
				ours = append(ours, f[0])
			}
		}
		if err != nil {
			note("ip netns list: %v", err)
		}
		row("ip netns list", len(ours) == 0 && err == nil, strings.Join(ours, ", "))
		if len(ours) > 0 {
			note("namespaces left: %s", strings.Join(ours, ", "))
		}
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		n := strings.Count(string(mi), d.sb.Name)
		row("mounts naming "+d.sb.Name, n == 0, "")
		if n > 0 {
			note("%d mount(s) still name %s", n, d.sb.Name)
		}
	}
	alive := 0
	for _, p := range pids {
		if syscall.Kill(p, 0) == nil {
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !strings.Contains(string(st), ") Z ") {
				alive++
			}
		}
	}
	row("processes started by the demo", alive == 0, fmt.Sprintf("%d started, %d alive", len(pids), alive))
	if alive > 0 {
		note("%d process(es) of the demo still alive", alive)
	}
	if d.tmp != "" {
		if err := os.RemoveAll(d.tmp); err != nil {
			note("remove %s: %v", d.tmp, err)
		}
		_, err := os.Stat(d.tmp)
		row("temp dir "+d.tmp, os.IsNotExist(err), "")
	}
	tw.Flush()
	d.ui.block(b.String())
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// settledHostState reads the sandbox host's state until its filters are
// back to the baseline or within has passed (deferred kernel work).
func (d *demo) settledHostState(within time.Duration) (hs hostState, err error) {
	wait.Until(within, func() bool {
		hs, err = readHostState(d.sb)
		return err != nil || !d.hasBase || hs.filters <= d.baseline.filters
	})
	return hs, err
}

// splitTables separates tc filter lines that only declare a u32 hash table
// ("... fh 200: ht divisor 64") from the rules.
func splitTables(lines []string) (rules, tables []string) {
	for _, l := range lines {
		if strings.Contains(l, " ht divisor ") {
			tables = append(tables, l)
		} else {
			rules = append(rules, l)
		}
	}
	return rules, tables
}

func first(l []string, n int) []string {
	if len(l) > n {
		return l[:n]
	}
	return l
}

// newLines returns up to max lines of after that are not in before (as a
// multiset).
func newLines(before, after []string, max int) []string {
	seen := map[string]int{}
	for _, l := range before {
		seen[l]++
	}
	var out []string
	for _, l := range after {
		if seen[l] > 0 {
			seen[l]--
			continue
		}
		if len(out) < max {
			out = append(out, l)
		}
	}
	return out
}

// removeNetnsMount unmounts (all stacked mounts, bounded) and removes a
// namespace handle file.
func removeNetnsMount(p string) {
	for i := 0; i < 8; i++ {
		if syscall.Unmount(p, syscall.MNT_DETACH) != nil {
			break
		}
	}
	os.Remove(p)
}

// sweepStaleDemoMounts removes /var/run/netns/isodemo-XXXXXX-<name> handles
// left by a demo that was killed before its cleanup (its daemon died with it,
// so nothing else would ever remove them). Only names of this demo whose
// sandbox is no longer registered as alive are touched.
func sweepStaleDemoMounts() int {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		name := e.Name()
		var sbName, ctrName string
		for _, suffix := range []string{"-alpha", "-beta", "-gamma"} {
			if strings.HasPrefix(name, "isodemo-") && strings.HasSuffix(name, suffix) && len(name) == len("isodemo-XXXXXX")+len(suffix) {
				sbName, ctrName = strings.TrimSuffix(name, suffix), suffix
			}
		}
		if ctrName == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(sandbox.RegistryDir, sbName)); err == nil {
			continue // its demo may still be running
		}
		if _, err := os.Stat(filepath.Join(netnsDir, sbName+"-host")); err == nil {
			continue
		}
		removeNetnsMount(filepath.Join(netnsDir, name))
		n++
	}
	return n
}
