package dataplane

import (
	"fmt"

	"github.com/isolatord/isolatord/nshandle"
	"github.com/isolatord/isolatord/tcfilter"
)

// openConn opens a tc batch socket in namespace ns: the host's (d.hc, for
// the veth filters) or a container's (its own filters, during Setup).
func openConn(ns *nshandle.NS) (*tcfilter.Conn, error) {
	var c *tcfilter.Conn
	err := ns.Do(func() (err error) {
		c, err = tcfilter.OpenConn()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tc batch socket in %s: %w", ns, err)
	}
	return c, nil
}
