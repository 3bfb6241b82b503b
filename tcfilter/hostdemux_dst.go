package tcfilter

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// SetDst makes the eth0 demux match dst, the host's new primary IPv4
// address (the host was renumbered at run time): the root nodes that name
// the address are replaced in one batch, and the echo steering program is
// rebuilt for it on the maps it already has (the echo identifiers learned
// and the containers' echo origins stay). Container entries are not
// touched: they lie in tables the roots link to. A demux without a
// destination (lo) refuses. It returns at once when the demux matches dst
// already; after a failure the next call repairs it (Init).
func (x *HostDemux) SetDst(dst net.IP) error {
	d4 := dst.To4()
	if d4 == nil {
		return fmt.Errorf("%s demux: destination %v is not IPv4", x.d.label, dst)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.dst == nil {
		return fmt.Errorf("%s demux: no destination to change", x.d.label)
	}
	if x.dst.Equal(d4) && x.ready {
		return nil
	}
	old := x.dst
	x.dst = d4
	if err := x.retargetEcho(); err != nil {
		x.dst = old
		return err
	}
	if !x.ready {
		return x.initLocked()
	}
	fs, err := x.d.list()
	if err == nil {
		err = syncFixed(x.c, x.d, append(x.rootNodes(), x.tableNodes()...), fs)
	}
	if err != nil {
		x.ready = false // the next call (or use) builds it again from the kernel
	}
	return err
}

// retargetEcho (with x.mu held) loads the echo steering program for x.dst
// on the echo maps in use and attaches it in place of the old one.
func (x *HostDemux) retargetEcho() error {
	if x.echo == nil {
		return nil
	}
	p, err := x.echo.loadSteer(x.dst)
	if err != nil {
		return fmt.Errorf("%s: echo steering for %s: %w", x.d.label, x.dst, err)
	}
	names := echoFilterNames(x.dst, x.counts != nil)
	if err := x.attachEcho(PrioEcho, unix.ETH_P_IP, p, x.echo.learn, names); err != nil {
		p.Close()
		return err
	}
	x.echo.steer.Close()
	x.echo.steer = p
	return nil
}
