// Command isotraffic is the command-line face of package test/traffic, run by
// isolatord's tests inside container and sandbox namespaces:
//
//	isotraffic serve --tcp ADDR[,ADDR...] --udp ADDR[,ADDR...] --name NAME [--reuseport]
//	    serve until killed; prints "ready" on stdout once every socket listens
//	isotraffic echo --net tcp|udp --addr A --msg M [--src IP:PORT] [--timeout 5s]
//	    print the reply ("<server name> M"); exit 1 on error/timeout
//	isotraffic rr|crr|bulk --addr A [--net tcp|udp] [--dur 1s]
//	    benchmark loop; prints a JSON result
//	isotraffic ping --dst IP [--count 3] [--timeout 1s]
//	    ICMP echo, or ICMPv6 echo to an IPv6 address (root); prints a JSON PingResult
//	isotraffic sink --addr A
//	    serve the benchmark modes only (name "sink"); prints "ready"
//
// Exit status: 0 success, 1 failure, 2 usage error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/isolatord/isolatord/test/traffic"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(ctx, args)
	case "sink":
		err = sink(ctx, args)
	case "echo":
		err = echo(ctx, args)
	case "rr", "crr", "bulk":
		err = bench(ctx, cmd, args)
	case "ping":
		err = ping(ctx, args)
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "isotraffic: unknown command %q\n", cmd)
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "isotraffic %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: isotraffic serve --tcp ADDR[,..] --udp ADDR[,..] --name NAME [--reuseport]
       isotraffic echo --net tcp|udp --addr ADDR --msg MSG [--src IP:PORT] [--timeout D]
       isotraffic rr|crr|bulk --addr ADDR [--net tcp|udp] [--dur D]
       isotraffic ping --dst IP [--count N] [--timeout D]
       isotraffic sink --addr ADDR`)
	os.Exit(2)
}

func newFlags(name string) *flag.FlagSet {
	return flag.NewFlagSet("isotraffic "+name, flag.ExitOnError)
}

func parse(fs *flag.FlagSet, args []string) {
	fs.Parse(args)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		os.Exit(2)
	}
}

func splitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func serve(ctx context.Context, args []string) error {
	fs := newFlags("serve")
	tcp := fs.String("tcp", "", "TCP listen address(es), comma-separated")
	udp := fs.String("udp", "", "UDP listen address(es), comma-separated")
	name := fs.String("name", "", "name put in front of every reply")
	reuse := fs.Bool("reuseport", false, "set SO_REUSEPORT on the sockets")
	parse(fs, args)
	if *name == "" {
		hn, _ := os.Hostname()
		*name = hn
	}
	if *tcp == "" && *udp == "" {
		return fmt.Errorf("need --tcp and/or --udp")
	}
	var opts []traffic.ServeOption
	if *reuse {
		opts = append(opts, traffic.WithReusePort())
	}
	var servers []*traffic.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for _, a := range splitList(*tcp) {
		s, err := traffic.ServeTCP(ctx, a, *name, opts...)
		if err != nil {
			return fmt.Errorf("tcp %s: %w", a, err)
		}
		servers = append(servers, s)
		fmt.Fprintf(os.Stderr, "serving tcp %s as %q\n", s.Addr(), *name)
	}
	for _, a := range splitList(*udp) {
		s, err := traffic.ServeUDP(ctx, a, *name, opts...)
		if err != nil {
			return fmt.Errorf("udp %s: %w", a, err)
		}
		servers = append(servers, s)
		fmt.Fprintf(os.Stderr, "serving udp %s as %q\n", s.Addr(), *name)
	}
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

func sink(ctx context.Context, args []string) error {
	fs := newFlags("sink")
	addr := fs.String("addr", ":0", "TCP listen address")
	parse(fs, args)
	s, err := traffic.ServeBulk(ctx, *addr)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(os.Stderr, "sink on tcp %s\n", s.Addr())
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

func echo(ctx context.Context, args []string) error {
	fs := newFlags("echo")
	network := fs.String("net", "tcp", "tcp or udp")
	addr := fs.String("addr", "", "server address IP:PORT")
	msg := fs.String("msg", "hello", "message (one line)")
	src := fs.String("src", "", "bind this local IP:PORT first")
	timeout := fs.Duration("timeout", traffic.DefaultTimeout, "give up after this long")
	parse(fs, args)
	if *addr == "" {
		return fmt.Errorf("need --addr")
	}
	opts := []traffic.Option{traffic.WithTimeout(*timeout)}
	if *src != "" {
		opts = append(opts, traffic.WithSource(*src))
	}
	reply, err := traffic.Echo(ctx, *network, *addr, *msg, opts...)
	if err != nil {
		return err
	}
	fmt.Println(reply)
	return nil
}

// BenchResult is what rr, crr and bulk print.
type BenchResult struct {
	Test    string  `json:"test"`
	Network string  `json:"net"`
	Addr    string  `json:"addr"`
	Dur     string  `json:"dur"`
	Rate    float64 `json:"rate"`
	Unit    string  `json:"unit"`
}

func bench(ctx context.Context, test string, args []string) error {
	fs := newFlags(test)
	network := fs.String("net", "tcp", "tcp or udp (rr only)")
	addr := fs.String("addr", "", "server address IP:PORT (isotraffic serve or sink)")
	dur := fs.Duration("dur", time.Second, "how long to run")
	parse(fs, args)
	if *addr == "" {
		return fmt.Errorf("need --addr")
	}
	if *dur <= 0 || *dur > 10*time.Minute {
		return fmt.Errorf("--dur %v out of range (0, 10m]", *dur)
	}
	res := BenchResult{Test: test, Network: *network, Addr: *addr, Dur: dur.String()}
	var err error
	switch test {
	case "rr":
		res.Unit = "transactions/s"
		res.Rate, err = traffic.RequestResponse(ctx, *network, *addr, *dur)
	case "crr":
		res.Network, res.Unit = "tcp", "connections/s"
		res.Rate, err = traffic.ConnectRate(ctx, *addr, *dur)
	case "bulk":
		res.Network, res.Unit = "tcp", "bytes/s"
		res.Rate, err = traffic.Bulk(ctx, *addr, *dur)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func ping(ctx context.Context, args []string) error {
	fs := newFlags("ping")
	dst := fs.String("dst", "", "IPv4 or IPv6 address (ICMPv6 echo)")
	count := fs.Int("count", 3, "echo requests to send")
	timeout := fs.Duration("timeout", time.Second, "wait per request")
	parse(fs, args)
	ip := net.ParseIP(*dst)
	if ip == nil {
		return fmt.Errorf("--dst %q is not an IP address", *dst)
	}
	res, err := traffic.PingStats(ctx, ip, *count, *timeout)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
