package tcfilter

// Refresh brings the fixed nodes of a veth whose filters Install made
// (with host IPv6 addresses, or without, as v has them) in line with v:
// the nodes that name the host's IPv4 address, MAC or IPv6 addresses, and
// the fixed redirects' targets. One dump of the veth, one batch; the
// range nodes are left as they are (Retarget points them elsewhere). It
// is what a change of the host's address or MAC at run time needs; a
// veth gaining or losing IPv6 needs Install.
func (v VethFilters) Refresh() error {
	if err := v.check(); err != nil {
		return err
	}
	d := v.dev()
	fs, err := d.list()
	if err != nil {
		return err
	}
	return syncFixed(v.C, d, v.fixedNodes(), fs)
}

// Refresh brings the root nodes of the container's lo, the only ones
// that name the host's addresses, in line with c (one dump of lo, one
// batch); the filters must have been installed.
func (c ContainerFilters) Refresh() error {
	if err := c.check(); err != nil {
		return err
	}
	d := c.lo()
	fs, err := d.list()
	if err != nil {
		return err
	}
	return syncFixed(c.C, d, append(c.loRoot(), ctrLo.linkNode()), fs)
}
