package main

// CNI before and after: with --cni-before DIR (scripts/bench.sh builds DIR
// from an earlier commit when CNI_BEFORE=<rev> is set), cniFigures times
// that build's isolator-cni and isolatorctl interleaved with the current
// ones, against the same daemon, and the report puts both side by side
// with the binaries' sizes.

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// CNIBefore are the CNI figures of an earlier build (Rev), taken in the
// same run as the current ones (ControlScale's CNIAdd, CNIDel, CNIExec,
// CtlList), and both builds' binary sizes.
type CNIBefore struct {
	Rev     string   `json:"rev,omitempty"`
	Add     *Latency `json:"cni_add"`
	Del     *Latency `json:"cni_del"`
	Exec    *Latency `json:"cni_exec"`
	CtlList *Latency `json:"ctl_list,omitempty"`
	// Sizes in bytes: Before of the earlier build, After of the current.
	PluginBytesBefore int64 `json:"plugin_bytes_before"`
	PluginBytesAfter  int64 `json:"plugin_bytes_after"`
	CtlBytesBefore    int64 `json:"ctl_bytes_before,omitempty"`
	CtlBytesAfter     int64 `json:"ctl_bytes_after,omitempty"`
}

// beforeBuild is the earlier build cniFigures measures beside the current
// one, and its samples.
type beforeBuild struct {
	dir, rev           string
	cni                *libcni.CNIConfig
	add, del, exe, ctl []time.Duration
}

// newBeforeBuild checks the earlier build in dir; nil when dir is "".
func newBeforeBuild(dir, rev, cacheDir string) (*beforeBuild, error) {
	if dir == "" {
		return nil, nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "isolator-cni")); err != nil {
		return nil, fmt.Errorf("--cni-before: %w", err)
	}
	return &beforeBuild{dir: dir, rev: rev, cni: libcni.NewCNIConfigWithCacheDir([]string{dir}, cacheDir, nil)}, nil
}

// sample takes one of each figure with the earlier build: ADD and DEL on
// a fresh namespace, VERSION, and `isolatorctl list` when the build has
// the CLI.
func (o *beforeBuild) sample(ctx context.Context, b *bench, list *libcni.NetworkConfigList, hs *holders, socket, id string, keep bool) error {
	a, d, err := b.cniSample(ctx, o.cni, list, hs, id)
	if err != nil {
		return fmt.Errorf("earlier build's plugin: %w", err)
	}
	t0 := time.Now()
	if _, err := o.cni.GetVersionInfo(ctx, "isolator-cni"); err != nil {
		return fmt.Errorf("earlier build's VERSION: %w", err)
	}
	e := time.Since(t0)
	var l time.Duration
	ctl := filepath.Join(o.dir, "isolatorctl")
	if _, err := os.Stat(ctl); err == nil {
		t0 = time.Now()
		if out, err := exec.CommandContext(ctx, ctl, "--socket", socket, "list").CombinedOutput(); err != nil {
			return fmt.Errorf("earlier build's isolatorctl list: %w: %s", err, out)
		}
		l = time.Since(t0)
	}
	if keep {
		o.add, o.del, o.exe = append(o.add, a), append(o.del, d), append(o.exe, e)
		if l > 0 {
			o.ctl = append(o.ctl, l)
		}
	}
	return nil
}

// result summarises the samples with both builds' sizes (bin: the
// current build's directory).
func (o *beforeBuild) result(bin string) *CNIBefore {
	size := func(dir, exe string) int64 {
		if fi, err := os.Stat(filepath.Join(dir, exe)); err == nil {
			return fi.Size()
		}
		return 0
	}
	return &CNIBefore{
		Rev: o.rev, Add: summarize(o.add), Del: summarize(o.del), Exec: summarize(o.exe), CtlList: summarize(o.ctl),
		PluginBytesBefore: size(o.dir, "isolator-cni"), PluginBytesAfter: size(bin, "isolator-cni"),
		CtlBytesBefore: size(o.dir, "isolatorctl"), CtlBytesAfter: size(bin, "isolatorctl"),
	}
}

// writeCNIBefore prints the earlier and the current build side by side.
func (c *ControlScale) writeCNIBefore(w io.Writer) {
	o := c.CNIBefore
	if o == nil {
		return
	}
	rev := o.Rev
	if rev == "" {
		rev = "earlier build"
	}
	mb := func(n int64) string {
		if n == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	fmt.Fprintf(w, "\n| CNI, p50 / p99 | before (%s) | after |\n|---|---|---|\n", rev)
	fmt.Fprintf(w, "| Plugin exec to VERSION result | %s | %s |\n", fmtMs(o.Exec), fmtMs(c.CNIExec))
	fmt.Fprintf(w, "| CNI ADD (libcni exec) | %s | %s |\n", fmtMs(o.Add), fmtMs(c.CNIAdd))
	fmt.Fprintf(w, "| CNI DEL (libcni exec) | %s | %s |\n", fmtMs(o.Del), fmtMs(c.CNIDel))
	if o.CtlList != nil {
		fmt.Fprintf(w, "| isolatorctl list | %s | %s |\n", fmtMs(o.CtlList), fmtMs(c.CtlList))
	}
	fmt.Fprintf(w, "| isolator-cni size | %s | %s |\n", mb(o.PluginBytesBefore), mb(o.PluginBytesAfter))
	if o.CtlBytesBefore > 0 {
		fmt.Fprintf(w, "| isolatorctl size | %s | %s |\n", mb(o.CtlBytesBefore), mb(o.CtlBytesAfter))
	}
}
