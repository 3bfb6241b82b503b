package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"

	"github.com/isolatord/isolatord/api/isolatord/v1/isolatordv1grpc"
)

// TestVerbsWaitForRestartingDaemon: with the daemon down (no socket, or a
// stale one refusing connections), DEL, CHECK and STATUS wait for it to
// come back within daemonWait and then succeed; with daemonWait 0 they fail
// at once; after the wait they fail naming the wait.
func TestVerbsWaitForRestartingDaemon(t *testing.T) {
	e := newEnv(t)
	if err := e.plugin.Add(cmdArgs("c1", e.conf("1.0.0", twoMappings))); err != nil {
		t.Fatal(err)
	}
	prev := e.out.String()
	e.stop()
	os.Remove(e.socket)

	// restartOnDial brings the daemon (with the same state) back on the
	// socket once a verb has failed to reach it at least once.
	var mu sync.Mutex
	var srv *grpc.Server
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Stop()
		}
	})
	dial := e.plugin.Dial
	failures := 0
	e.plugin.Dial = func(ctx context.Context, socket string) (isolatordv1grpc.IsolatorClient, func() error, error) {
		c, closeConn, err := dial(ctx, socket)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failures++
			if srv == nil {
				lis, lerr := net.Listen("unix", e.socket)
				if lerr != nil {
					t.Errorf("restart the fake daemon: %v", lerr)
					return c, closeConn, err
				}
				srv = grpc.NewServer()
				isolatordv1grpc.RegisterIsolatorServer(srv, e.daemon)
				go srv.Serve(lis)
			}
		}
		return c, closeConn, err
	}
	stopDaemon := func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Stop()
			srv = nil
		}
		os.Remove(e.socket)
		failures = 0
	}

	e.plugin.DaemonWait = 5 * time.Second
	check := cmdArgs("c1", e.conf("1.0.0", twoMappings+`,"prevResult":`+prev))
	for _, v := range []struct {
		name string
		run  func() error
	}{
		{"STATUS", func() error { return e.plugin.Status(&skel.CmdArgs{StdinData: e.conf("1.1.0", "")}) }},
		{"CHECK", func() error { return e.plugin.Check(check) }},
		{"DEL", func() error { return e.plugin.Del(cmdArgs("c1", e.conf("1.0.0", ""))) }},
	} {
		stopDaemon()
		if err := v.run(); err != nil {
			t.Errorf("%s while the daemon restarts: %v", v.name, err)
		}
		mu.Lock()
		if failures == 0 {
			t.Errorf("%s never found the daemon down", v.name)
		}
		mu.Unlock()
	}
	if e.daemon.has("c1") {
		t.Error("DEL after the wait did not remove c1")
	}

	// No wait: DEL fails at once with "try again later".
	e.plugin.Dial = dial
	stopDaemon()
	e.plugin.DaemonWait = time.Hour // the configuration's daemonWait wins
	start := time.Now()
	cniErr(t, e.plugin.Del(cmdArgs("c1", e.conf("1.0.0", `,"daemonWait":"0"`))), types.ErrTryAgainLater)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("DEL with daemonWait 0 took %v", d)
	}
	// A bounded wait, then the error says it waited.
	start = time.Now()
	ce := cniErr(t, e.plugin.Del(cmdArgs("c1", e.conf("1.0.0", `,"daemonWait":0.5`))), types.ErrTryAgainLater)
	if d := time.Since(start); d < 400*time.Millisecond || d > 5*time.Second {
		t.Errorf("DEL with daemonWait 0.5 failed after %v", d)
	}
	if !strings.Contains(ce.Msg, "waited") {
		t.Errorf("message %q does not say it waited", ce.Msg)
	}
	for _, bad := range []string{`"forever"`, `"-1s"`, `"1h"`, `true`} {
		if _, err := parseConfig(e.conf("1.0.0", `,"daemonWait":`+bad)); err == nil {
			t.Errorf("daemonWait %s accepted", bad)
		}
	}
}

// TestMuteDaemonIsTryAgainLater: a socket that takes connections but never
// speaks (a daemon that does not come up behind a socket systemd holds)
// fails ADD and DEL with "try again later" and STATUS with "not
// available", naming the socket, within the dial timeout rather than the
// verb's: the connection's failure, found with the first call.
func TestMuteDaemonIsTryAgainLater(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	p := newPlugin(&strings.Builder{})
	p.Timeout, p.StatusTimeout, p.DialTimeout, p.DaemonWait = time.Minute, time.Minute, 300*time.Millisecond, 0
	p.ReadNS = func(string, string) (nsIface, error) { return nsIface{}, errors.New("not reached") }
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"isolator","type":"isolator-cni","socket":%q}`, sock))
	for _, v := range []struct {
		name string
		run  func() error
		code uint
		msg  string
	}{
		{"ADD", func() error { return p.Add(cmdArgs("c1", conf)) }, types.ErrTryAgainLater, "cannot connect to isolatord at " + sock + ": context deadline exceeded"},
		{"DEL", func() error { return p.Del(cmdArgs("c1", conf)) }, types.ErrTryAgainLater, "cannot connect to isolatord at " + sock + ": context deadline exceeded"},
		{"STATUS", func() error { return p.Status(&skel.CmdArgs{StdinData: conf}) }, types.ErrPluginNotAvailable, "isolatord is not available: cannot connect to isolatord at " + sock},
	} {
		start := time.Now()
		e := cniErr(t, v.run(), v.code)
		if !strings.HasPrefix(e.Msg, v.msg) {
			t.Errorf("%s: message %q, want %q", v.name, e.Msg, v.msg)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s failed after %v, not at the 300ms dial timeout", v.name, d)
		}
	}
}
