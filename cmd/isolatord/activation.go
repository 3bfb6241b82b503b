package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// listenFdsStart is the first file descriptor systemd passes
// (SD_LISTEN_FDS_START).
const listenFdsStart = 3

// activatedListener returns the listening unix socket systemd passed by
// socket activation (packaging/isolatord.socket: LISTEN_PID is ours,
// LISTEN_FDS >= 1, the socket at fd 3), or nil when there is none. The
// LISTEN_* variables are removed so nothing started later inherits them.
// While the daemon restarts, systemd keeps the socket open and connections
// queue in its backlog: runtimes never see the socket missing.
func activatedListener() (net.Listener, error) {
	pid, fds := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	if pid == "" || fds == "" {
		return nil, nil
	}
	if p, err := strconv.Atoi(pid); err != nil || p != os.Getpid() {
		return nil, nil // meant for another process
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("socket activation: LISTEN_FDS=%q", fds)
	}
	if n > 1 {
		return nil, fmt.Errorf("socket activation: %d sockets passed, isolatord serves exactly one (its unix socket)", n)
	}
	fd := listenFdsStart
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return nil, fmt.Errorf("socket activation: fd %d is not a stream socket (%v)", fd, err)
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc != 1 {
		return nil, fmt.Errorf("socket activation: fd %d is not listening (Accept=no is required)", fd)
	}
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "LISTEN_FD_3")
	lis, err := net.FileListener(f) // dups the descriptor
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	if _, ok := lis.(*net.UnixListener); !ok {
		lis.Close()
		return nil, fmt.Errorf("socket activation: fd %d is a %s socket, not a unix one", fd, lis.Addr().Network())
	}
	// Closing our listener at shutdown must not unlink the socket systemd
	// owns: it stays to queue connections for the next start.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	return lis, nil
}

// listen returns the socket systemd passed, or else listens on path
// itself. owned reports whether the daemon created the socket file (and so
// removes it on exit).
func listen(path string, log *slog.Logger) (lis net.Listener, owned bool, err error) {
	lis, err = activatedListener()
	if err != nil {
		return nil, false, err
	}
	if lis != nil {
		if addr := lis.Addr().String(); addr != path {
			log.Warn("the socket systemd passed is not --socket; serving the passed one", "passed", addr, "socket", path)
		}
		log.Info("serving the socket passed by systemd (socket activation)", "socket", lis.Addr().String())
		return lis, false, nil
	}
	lis, err = listenUnix(path)
	return lis, err == nil, err
}
