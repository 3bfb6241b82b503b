package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/isolatord/isolatord/test/daemonproc"
)

// daemon is isolatord as the benchmark runs it (test/daemonproc).
type daemon = daemonproc.Process

// rssBytes returns the daemon's resident set size (VmRSS) and its peak
// (VmHWM) from /proc/<pid>/status.
func rssBytes(d *daemon) (rss, hwm int64, err error) {
	pid := d.Pid()
	if pid == 0 {
		return 0, 0, errors.New("isolatord is not running")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}

// logField returns field key of the last JSON log line whose msg is msg.
func logField(d *daemon, msg, key string) (any, bool) {
	lines := strings.Split(d.Log(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], `"msg":"`+msg+`"`) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(lines[i]), &m) != nil {
			continue
		}
		v, ok := m[key]
		return v, ok
	}
	return nil, false
}

// cpuSeconds returns the CPU time (user + system) the daemon used so far,
// from /proc/<pid>/stat.
func cpuSeconds(d *daemon) (float64, error) {
	pid := d.Pid()
	if pid == 0 {
		return 0, errors.New("not running")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64) // field 14: utime
	st, err2 := strconv.ParseFloat(f[12], 64) // field 15: stime
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed stat")
	}
	return (ut + st) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100
