// Command isodemo is `make demo`: it shows isolatord working, end to end, in a
// throw-away sandbox of network namespaces, for someone who has never seen it.
//
// It builds a sandbox (test/sandbox: a "host" namespace playing the machine
// and a "client" namespace playing the outside world; the machine's real eth0
// is never touched), starts the built isolatord with its host side in the
// sandbox host (nsenter --net, state in a temp dir, namespace handles under
// /var/run/netns so `ip netns exec` works), starts three "containers"
// (processes in fresh network namespaces running isotraffic servers that
// answer with their name; two of them share one port with SO_REUSEPORT),
// isolates them through isolatorctl, and then shows the assignments, a
// request from the client reaching each container, the shared port spreading
// connections, `ip netns exec <id> ss -ltn`, a few lines of /metrics, a
// kill -9 and restart of the daemon with traffic flowing, and a cleanup that
// is checked to leave nothing behind.
//
// Every step is a numbered heading with a one-line explanation. A step that
// cannot work (for example a feature that is not there yet) fails with the
// reason and the steps that depend on it are skipped; the cleanup always
// runs, on failure and on SIGINT/SIGTERM too. The last line is a verdict, and
// the exit status is 0 only if every step worked.
//
// Usage (as root, from the repository root, after `make build`):
//
//	isodemo --bin bin --isotraffic /path/to/isotraffic
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/daemonproc"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout))
}

// options are isodemo's flags.
type options struct {
	bin        string        // directory holding isolatord and isolatorctl
	isotraffic string        // path of the isotraffic binary
	timeout    time.Duration // bound on the whole run (cleanup has its own)
	color      string        // auto, always, never
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("isodemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "directory holding the built isolatord and isolatorctl (make build)")
	fs.StringVar(&o.isotraffic, "isotraffic", "", "path of the isotraffic binary (go build ./test/cmd/isotraffic); default: next to isodemo")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up on the demo after this long (the cleanup still runs)")
	fs.StringVar(&o.color, "color", "auto", "colored output: auto, always or never")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.isotraffic == "" {
		if exe, err := os.Executable(); err == nil {
			o.isotraffic = filepath.Join(filepath.Dir(exe), "isotraffic")
		}
	}
	return o, nil
}

func run(args []string, stdout io.Writer) int {
	o, err := parseFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "isodemo:", err)
		return 2
	}
	u := newUI(stdout, o.color)
	if os.Geteuid() != 0 {
		u.linef("isodemo must run as root: it creates network namespaces, veths and tc filters (all inside its own sandbox).")
		u.verdict(false, "not run: needs root")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	d := &demo{ui: u, opts: o}
	ok := d.run(ctx)
	if !ok && ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return 130 // interrupted
	}
	if !ok {
		return 1
	}
	return 0
}

// ui prints headings, tables and results for people.
type ui struct {
	w     io.Writer
	color bool
}

func newUI(w io.Writer, mode string) *ui {
	color := false
	switch mode {
	case "always":
		color = true
	case "never":
	default:
		if f, ok := w.(*os.File); ok && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb" {
			_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
			color = err == nil
		}
	}
	return &ui{w: w, color: color}
}

func (u *ui) paint(code, s string) string {
	if !u.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (u *ui) linef(format string, a ...any) { fmt.Fprintf(u.w, format+"\n", a...) }

// heading prints a step's numbered title and its explanation.
func (u *ui) heading(n, total int, title, explain string) {
	fmt.Fprintln(u.w)
	u.linef("%s", u.paint("1", fmt.Sprintf("== Step %d/%d: %s", n, total, title)))
	for _, l := range wrap(explain, 88) {
		u.linef("   %s", u.paint("2", l))
	}
}

// command shows a command line as a person would type it.
func (u *ui) command(argv ...string) {
	u.linef("   %s %s", u.paint("36", "$"), strings.Join(argv, " "))
}

// block prints text indented under the current step.
func (u *ui) block(text string) {
	if s := daemonproc.Indent(text, "     "); s != "" {
		u.linef("%s", s)
	}
}

func (u *ui) result(ok bool, msg string) {
	if ok {
		u.linef("   %s %s", u.paint("32", "OK"), msg)
	} else {
		u.linef("   %s %s", u.paint("31", "FAILED:"), daemonproc.Indent(msg, "     ")[5:])
	}
}

func (u *ui) skipped(msg string) { u.linef("   %s %s", u.paint("33", "SKIPPED:"), msg) }

func (u *ui) verdict(ok bool, msg string) {
	fmt.Fprintln(u.w)
	if ok {
		u.linef("%s", u.paint("1;32", "VERDICT: PASS - "+msg))
	} else {
		u.linef("%s", u.paint("1;31", "VERDICT: FAIL - "+msg))
	}
}

// wrap splits s into lines of at most width characters at spaces.
func wrap(s string, width int) []string {
	var lines []string
	var cur strings.Builder
	for _, w := range strings.Fields(s) {
		if cur.Len() > 0 && cur.Len()+1+len(w) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(w)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

// histogram renders counts as bars, one line per label, in the given order.
func histogram(labels []string, counts map[string]int, width int) string {
	max, total := 0, 0
	for _, l := range labels {
		if counts[l] > max {
			max = counts[l]
		}
		total += counts[l]
	}
	lw := 0
	for _, l := range labels {
		lw = maxInt(lw, len(l))
	}
	var b strings.Builder
	for _, l := range labels {
		n := counts[l]
		bar := 0
		if max > 0 {
			bar = (n*width + max - 1) / max
		}
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(n) / float64(total)
		}
		fmt.Fprintf(&b, "%-*s |%-*s| %2d (%3.0f%%)\n", lw, l, width, strings.Repeat("#", bar), n, pct)
	}
	return b.String()
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
