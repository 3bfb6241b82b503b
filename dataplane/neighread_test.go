package dataplane

import "testing"

// TestSetupReadsNoNeighbourTable: Setup has the neighbour syncer serve the
// container without reading its neighbour table (a dump walks every
// namespace's entries: each setup would cost more with every container
// present), and the container's neighbours are served all the same: the
// client reaches it and gets its answer.
func TestSetupReadsNoNeighbourTable(t *testing.T) {
	e := newEnv(t)
	e.start("A", 1, "40960-41983", "31000-31009", "", 31000)
	e.start("B", 2, "41984-43007", "31010-31019", "", 31010)
	if r := e.d.NeighStats().Reads; r != 0 {
		t.Errorf("%d neighbour tables read by two setups, want none", r)
	}
	mustEcho(t, e.sb.Client, "tcp", hostAddr(31000), "A")
	mustEcho(t, e.sb.Client, "udp", hostAddr(31010), "B")
}
