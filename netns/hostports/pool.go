package hostports

// The ephemeral pool cannot be reserved socket by socket (containers bind
// its ports inside their own namespaces, and it is large). Two things keep
// host processes off it instead: the lifecycle refuses a pool that overlaps
// the host's ip_local_port_range (ephemeral.ValidatePools), and ReservePool
// puts the pool into the host's net.ipv4.ip_local_reserved_ports, so the
// kernel never picks one of its ports for a host socket's autobind (connect
// or bind to port 0), even if the operator widens ip_local_port_range
// later. A host process that binds a pool port explicitly is not stopped:
// that is the operator's business (docs: README, "Host ports").
//
// The sysctl is per network namespace, so containers' own namespaces (whose
// ip_local_port_range is their block of the pool) are not affected.
//
// What isolatord added (the pool ports that were not reserved already) is
// recorded in a file of the state directory: at the next start, ports of an
// earlier pool that the new pool no longer has are taken out again, and
// ports the operator had reserved themselves are never removed.

import (
	"os"

	"github.com/isolatord/isolatord/ephemeral"
)

const reservedPortsSysctl = "net/ipv4/ip_local_reserved_ports"

// PoolResult is what ReservePool found and did.
type PoolResult struct {
	Original string        // the sysctl's value before (as the kernel prints it)
	Value    string        // its value now
	Added    ephemeral.Set // ports isolatord has added (this run and earlier ones)
	Removed  ephemeral.Set // ports of an earlier pool taken out
}

// Changed reports whether the sysctl was written.
func (r PoolResult) Changed() bool { return r.Original != r.Value }

// MergeReserved computes the new reserved-port set from the current one,
// the ports an earlier run added (prev) and the pool: prev's ports no longer
// in the pool go, the pool's ports come in. It returns the new set and the
// ports isolatord holds there (the marker to record).
func MergeReserved(current, prev, pool ephemeral.Set) (next, ours ephemeral.Set) {
	base := current.Subtract(prev.Subtract(pool))
	added := pool.Subtract(base)
	return base.Union(pool), prev.Intersect(pool).Union(added)
}

func writeFileAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
