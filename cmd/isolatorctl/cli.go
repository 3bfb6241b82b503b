package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"google.golang.org/grpc/status"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the daemon or the connection failed
	exitUsage = 2 // bad command line
)

// socketEnv overrides api.DefaultSocket as the default of --socket.
const socketEnv = "ISOLATORD_SOCKET"

const defaultTimeout = 30 * time.Second

// globals are the flags every command accepts, before or after its name.
type globals struct {
	socket  string
	output  string
	timeout time.Duration
}

// register defines the global flags on fs, with their current values as
// defaults, so registering them again on a command's flag set keeps what the
// command line said before the command.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.socket, "socket", g.socket, "isolatord's unix socket `PATH` ($"+socketEnv+" overrides the default)")
	fs.StringVar(&g.output, "o", g.output, "output `format`: table or json")
	fs.StringVar(&g.output, "output", g.output, "output `format`, same as -o")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "give up on the daemon after this `duration`")
}

// result is what a command prints.
type result interface {
	// writeTable prints the result for people.
	writeTable(w io.Writer) error
	// jsonValue is the value printed with -o json.
	jsonValue() any
}

// call makes a command's RPC.
type call func(ctx context.Context, c *api.Client) (result, error)

// command is one isolatorctl command.
type command struct {
	name     string
	synopsis string // arguments, after "isolatorctl NAME"
	summary  string
	takesID  bool
	// setup defines the command's own flags on fs and returns build, which
	// runs after parsing: it validates the flags (an error is a usage error)
	// and returns the RPC to make.
	setup func(fs *flag.FlagSet) func(id string) (call, error)
}

var commands = []*command{
	{
		name:     "prepare",
		synopsis: "ID [--ports LIST] [--shared-ports LIST] [--handoff-from ID --handoff-ports LIST] [--egress-rate-limit RATE] ...",
		summary:  "reserve an ephemeral block and static ports for a new container",
		takesID:  true,
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			pf := addPortFlags(fs)
			lf := addLimitFlags(fs, "the daemon's default")
			hf := addHandoffFlags(fs)
			return func(id string) (call, error) {
				ports, err := pf.ranges()
				if err != nil {
					return nil, err
				}
				from, handed, err := hf.parse()
				if err != nil {
					return nil, err
				}
				egress, ingress, err := lf.limits(flagsSet(fs))
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Prepare(ctx, &isolatordv1.PrepareRequest{ContainerId: id, Ports: ports, EgressLimit: egress, IngressLimit: ingress,
						HandoffFrom: from, HandoffPorts: handed})
					return containerResult{resp.GetContainer()}, err
				}, nil
			}
		},
	},
	{
		name:     "isolate",
		synopsis: "ID (--pid PID | --netns PATH)",
		summary:  "configure the container's network namespace and start its traffic",
		takesID:  true,
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			pid := fs.Int64("pid", 0, "a `PID` inside the container's network namespace")
			nsPath := fs.String("netns", "", "`path` of the container's network namespace handle")
			return func(id string) (call, error) {
				req := &isolatordv1.IsolateRequest{ContainerId: id}
				set := flagsSet(fs)
				switch {
				case set["pid"] && set["netns"]:
					return nil, errors.New("give either --pid or --netns, not both")
				case set["pid"]:
					if *pid <= 0 || *pid > math.MaxInt32 {
						return nil, fmt.Errorf("--pid %d: not a process id", *pid)
					}
					req.Target = &isolatordv1.IsolateRequest_Pid{Pid: int32(*pid)}
				case set["netns"]:
					if strings.TrimSpace(*nsPath) == "" {
						return nil, errors.New("--netns: empty path")
					}
					// The daemon resolves paths in its own working directory.
					abs, err := filepath.Abs(*nsPath)
					if err != nil {
						return nil, fmt.Errorf("--netns %s: %w", *nsPath, err)
					}
					req.Target = &isolatordv1.IsolateRequest_NetnsPath{NetnsPath: abs}
				default:
					return nil, errors.New("give the container's network namespace with --pid or --netns")
				}
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Isolate(ctx, req)
					return containerResult{resp.GetContainer()}, err
				}, nil
			}
		},
	},
	{
		name:     "update",
		synopsis: "ID [--ports LIST] [--shared-ports LIST] [--egress-rate-limit RATE] [--ingress-rate-limit RATE] ...",
		summary:  "replace the container's static ports (ports not listed are released) and/or change its bandwidth limits",
		takesID:  true,
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			pf := addPortFlags(fs)
			lf := addLimitFlags(fs, "unchanged")
			return func(id string) (call, error) {
				set := flagsSet(fs)
				egress, ingress, err := lf.limits(set)
				if err != nil {
					return nil, err
				}
				keep := !set["ports"] && !set["shared-ports"]
				if keep && egress == nil && ingress == nil {
					// Guard against releasing every port by accident.
					return nil, errors.New("give the complete new port list with --ports and/or --shared-ports (--ports '' releases all), and/or new limits with --egress-rate-limit, --ingress-rate-limit")
				}
				ports, err := pf.ranges()
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Update(ctx, &isolatordv1.UpdateRequest{ContainerId: id, Ports: ports, KeepPorts: keep, EgressLimit: egress, IngressLimit: ingress})
					return containerResult{resp.GetContainer()}, err
				}, nil
			}
		},
	},
	{
		name:     "usage",
		synopsis: "ID [--snmp]",
		summary:  "show the container's traffic counters and TCP statistics",
		takesID:  true,
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			snmp := fs.Bool("snmp", false, "also list the SNMP counters in the table (JSON always has them)")
			return func(id string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Usage(ctx, &isolatordv1.UsageRequest{ContainerId: id})
					return usageResult{resp, *snmp}, err
				}, nil
			}
		},
	},
	{
		name:     "cleanup",
		synopsis: "ID",
		summary:  "remove everything isolatord made for the container and release its ports",
		takesID:  true,
		setup: func(*flag.FlagSet) func(string) (call, error) {
			return func(id string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					_, err := c.Cleanup(ctx, &isolatordv1.CleanupRequest{ContainerId: id})
					return cleanupResult{id}, err
				}, nil
			}
		},
	},
	{
		name:     "get",
		synopsis: "ID",
		summary:  "show one container",
		takesID:  true,
		setup: func(*flag.FlagSet) func(string) (call, error) {
			return func(id string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Get(ctx, &isolatordv1.GetRequest{ContainerId: id})
					return containerResult{resp.GetContainer()}, err
				}, nil
			}
		},
	},
	{
		name:     "list",
		synopsis: "[--label KEY=VALUE]...",
		summary:  "list every container (those with all the given labels)",
		setup: func(fs *flag.FlagSet) func(string) (call, error) {
			var want labelFilter
			fs.Var(&want, "label", "only containers with label `KEY=VALUE` (repeat: all of them)")
			return func(string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.List(ctx, &isolatordv1.ListRequest{})
					return listResult(want.filter(resp.GetContainers())), err
				}, nil
			}
		},
	},
	{
		name:    "status",
		summary: "show the daemon's version, port pools, features and container counts",
		setup: func(*flag.FlagSet) func(string) (call, error) {
			return func(string) (call, error) {
				return func(ctx context.Context, c *api.Client) (result, error) {
					resp, err := c.Status(ctx, &isolatordv1.StatusRequest{})
					return statusResult{resp}, err
				}, nil
			}
		},
	},
}

// usageLine is "isolatorctl NAME SYNOPSIS".
func (c *command) usageLine() string {
	return strings.TrimSpace("isolatorctl " + c.name + " " + c.synopsis)
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// portFlags are --ports and --shared-ports.
type portFlags struct {
	exclusive, shared string
}

func addPortFlags(fs *flag.FlagSet) *portFlags {
	p := &portFlags{}
	fs.StringVar(&p.exclusive, "ports", "", "static ports held exclusively, a `LIST` such as 31000-31099,32000")
	fs.StringVar(&p.shared, "shared-ports", "", "static ports that may be shared with other containers (SO_REUSEPORT), a `LIST`")
	return p
}

// ranges parses both lists into PortRanges sorted by begin. A port may not be
// in both lists.
func (p *portFlags) ranges() ([]*isolatordv1.PortRange, error) {
	excl, err := ephemeral.ParseSet(p.exclusive)
	if err != nil {
		return nil, fmt.Errorf("--ports: %w", err)
	}
	shared, err := ephemeral.ParseSet(p.shared)
	if err != nil {
		return nil, fmt.Errorf("--shared-ports: %w", err)
	}
	if both := excl.Intersect(shared); !both.Empty() {
		return nil, fmt.Errorf("ports in both --ports and --shared-ports: %s", both)
	}
	var out []*isolatordv1.PortRange
	for _, r := range excl.Ranges() {
		out = append(out, &isolatordv1.PortRange{Begin: uint32(r.Begin), End: uint32(r.End)})
	}
	for _, r := range shared.Ranges() {
		out = append(out, &isolatordv1.PortRange{Begin: uint32(r.Begin), End: uint32(r.End), Shared: true})
	}
	slices.SortFunc(out, func(a, b *isolatordv1.PortRange) int { return int(a.Begin) - int(b.Begin) })
	return out, nil
}

// limitFlags are the bandwidth flags of one command: --egress-rate-limit,
// --egress-burst, --egress-ceil and the same for ingress.
type limitFlags struct {
	dirs [2]limitDir
}

type limitDir struct {
	name              string // egress | ingress
	rate, burst, ceil string
}

func addLimitFlags(fs *flag.FlagSet, unset string) *limitFlags {
	l := &limitFlags{dirs: [2]limitDir{{name: "egress"}, {name: "ingress"}}}
	for i := range l.dirs {
		d := &l.dirs[i]
		what := map[string]string{"egress": "sends", "ingress": "receives"}[d.name]
		fs.StringVar(&d.rate, d.name+"-rate-limit", "", "limit on what the container "+what+", a `RATE` such as 10MB/s, 100Mbit or 2000000 (bytes/s); none or 0 removes it (not given: "+unset+")")
		fs.StringVar(&d.burst, d.name+"-burst", "", "bytes that may pass above the "+d.name+" rate after an idle time, a `SIZE` such as 256KiB (default: 10 ms at the rate, at least 64KiB)")
		fs.StringVar(&d.ceil, d.name+"-ceil", "", "peak "+d.name+" `RATE` while bursting (default: line speed)")
	}
	return l
}

// limits returns the limit of each direction whose flags were given (nil
// for the others). A burst or ceil needs the rate in the same command.
func (l *limitFlags) limits(set map[string]bool) (egress, ingress *isolatordv1.BandwidthLimit, err error) {
	out := [2]*isolatordv1.BandwidthLimit{}
	for i, d := range l.dirs {
		r, b, c := set[d.name+"-rate-limit"], set[d.name+"-burst"], set[d.name+"-ceil"]
		if !r && !b && !c {
			continue
		}
		if !r {
			return nil, nil, fmt.Errorf("--%s-burst and --%s-ceil need --%s-rate-limit", d.name, d.name, d.name)
		}
		bl := &isolatordv1.BandwidthLimit{}
		v, err := rate.Parse(d.rate)
		if err != nil {
			return nil, nil, fmt.Errorf("--%s-rate-limit: %w", d.name, err)
		}
		bl.Rate = int64(v)
		if b {
			if v, err = rate.ParseSize(d.burst); err != nil {
				return nil, nil, fmt.Errorf("--%s-burst: %w", d.name, err)
			}
			bl.Burst = int64(v)
		}
		if c {
			if v, err = rate.Parse(d.ceil); err != nil {
				return nil, nil, fmt.Errorf("--%s-ceil: %w", d.name, err)
			}
			bl.Ceil = int64(v)
		}
		if bl.Rate == 0 && (bl.Burst != 0 || bl.Ceil != 0) {
			return nil, nil, fmt.Errorf("--%s-burst and --%s-ceil need a --%s-rate-limit other than none", d.name, d.name, d.name)
		}
		out[i] = bl
	}
	return out[0], out[1], nil
}

// flagsSet returns the names of the flags the command line set on fs.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// parseInterleaved parses args with fs, letting flags and positional
// arguments come in any order, and returns the positional ones. Everything
// after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func defaultSocket() string {
	if s := os.Getenv(socketEnv); s != "" {
		return s
	}
	return api.DefaultSocket
}

// run is isolatorctl: it parses args (without the program name), makes one
// RPC, prints its result on stdout and any error on stderr, and returns the
// exit code.
func run(args []string, stdout, stderr io.Writer) int {
	g := &globals{socket: defaultSocket(), output: "table", timeout: defaultTimeout}
	root := flag.NewFlagSet("isolatorctl", flag.ContinueOnError)
	root.SetOutput(stderr)
	g.register(root)
	showVersion := root.Bool("version", false, "print isolatorctl's version and exit")
	root.Usage = func() {} // printed below, long or short
	if err := root.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			root.SetOutput(stdout)
			mainUsage(stdout, root)
			return exitOK
		}
		shortUsage(stderr)
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, "isolatorctl", version)
		return exitOK
	}
	rest := root.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "isolatorctl: missing command")
		shortUsage(stderr)
		return exitUsage
	}
	if rest[0] == "help" {
		if len(rest) > 1 {
			if cmd := findCommand(rest[1]); cmd != nil {
				fs, _ := newCommandFlags(cmd, g, stdout)
				commandUsage(stdout, cmd, fs)
				return exitOK
			}
		}
		root.SetOutput(stdout)
		mainUsage(stdout, root)
		return exitOK
	}
	cmd := findCommand(rest[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "isolatorctl: unknown command %q\n", rest[0])
		shortUsage(stderr)
		return exitUsage
	}

	fs, build := newCommandFlags(cmd, g, stderr)
	pos, err := parseInterleaved(fs, rest[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			commandUsage(stdout, cmd, fs)
			return exitOK
		}
		// The flag package printed the error.
		commandShortUsage(stderr, cmd)
		return exitUsage
	}
	usageErr := func(msg string) int {
		fmt.Fprintf(stderr, "isolatorctl %s: %s\n", cmd.name, msg)
		commandShortUsage(stderr, cmd)
		return exitUsage
	}
	var id string
	if cmd.takesID {
		if len(pos) == 0 {
			return usageErr("missing container ID")
		}
		id, pos = pos[0], pos[1:]
		if strings.TrimSpace(id) == "" {
			return usageErr("empty container ID")
		}
	}
	if len(pos) > 0 {
		return usageErr(fmt.Sprintf("unexpected argument %q", pos[0]))
	}
	if g.output != "table" && g.output != "json" {
		return usageErr(fmt.Sprintf("-o %q: the output format is table or json", g.output))
	}
	if g.timeout <= 0 {
		return usageErr(fmt.Sprintf("--timeout %v: must be positive", g.timeout))
	}
	if g.socket == "" {
		return usageErr("--socket: empty path")
	}
	do, err := build(id)
	if err != nil {
		return usageErr(err.Error())
	}

	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	client, err := api.Dial(ctx, g.socket)
	if err != nil {
		fmt.Fprintf(stderr, "isolatorctl: %v\n", err)
		return exitError
	}
	defer client.Close()
	res, err := do(ctx, client)
	if err != nil {
		fmt.Fprintf(stderr, "isolatorctl: %s\n", describeError(err))
		return exitError
	}
	if g.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		err = enc.Encode(res.jsonValue())
	} else {
		err = res.writeTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "isolatorctl: writing output: %v\n", err)
		return exitError
	}
	return exitOK
}

// describeError renders an RPC error as "Code: message".
func describeError(err error) string {
	if st, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return err.Error()
}

// newCommandFlags makes cmd's flag set, with its own flags and the global
// ones, and returns it with cmd's build function. Parse errors go to w.
func newCommandFlags(cmd *command, g *globals, w io.Writer) (*flag.FlagSet, func(string) (call, error)) {
	fs := flag.NewFlagSet("isolatorctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {} // run prints the usage, long or short
	build := cmd.setup(fs)
	g.register(fs)
	return fs, build
}

// commandUsage is a command's help: synopsis, summary and flags.
func commandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s.\n", cmd.usageLine(), capitalize(cmd.summary))
	if strings.Contains(cmd.synopsis, "LIST") {
		fmt.Fprintln(w, "\nLIST is a comma-separated list of ports and inclusive ranges, such as 31000-31099,32000.")
	}
	if strings.Contains(cmd.synopsis, "RATE") {
		fmt.Fprintln(w, "RATE is bytes per second, or a number with a unit: 10MB/s, 10MiB/s (bytes), 100Mbit, 100mbps (bits).")
	}
	fmt.Fprintln(w, "\nFlags (global ones included; they may follow the ID):")
	fs.PrintDefaults()
}

// commandShortUsage follows a usage error.
func commandShortUsage(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "usage: %s\nRun 'isolatorctl help %s' for its flags.\n", cmd.usageLine(), cmd.name)
}

// shortUsage follows a usage error before the command.
func shortUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: isolatorctl [--socket PATH] [-o table|json] [--timeout DURATION] COMMAND [ARGS]")
	fmt.Fprintln(w, "Run 'isolatorctl help' for the commands.")
}

func mainUsage(w io.Writer, root *flag.FlagSet) {
	fmt.Fprintln(w, "usage: isolatorctl [--socket PATH] [-o table|json] [--timeout DURATION] COMMAND [ARGS]")
	fmt.Fprintln(w, "\nCommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.synopsis, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nLIST is a comma-separated list of ports and inclusive ranges, such as 31000-31099,32000.")
	fmt.Fprintln(w, "Flags may follow the container ID; global flags may follow the command.")
	fmt.Fprintln(w, "Run 'isolatorctl help COMMAND' for a command's flags.")
	fmt.Fprintln(w, "\nGlobal flags:")
	root.PrintDefaults()
	fmt.Fprintln(w, "\nExit status: 0 success, 1 the daemon or the connection failed, 2 bad usage.")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
