package hostports

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/netns/sysctl"
)

// ReservePool merges pool into the host namespace's
// net.ipv4.ip_local_reserved_ports (see the notes above); marker is the
// file recording what isolatord added.
func (p *Ports) ReservePool(pool ephemeral.Set, marker string) (PoolResult, error) {
	var res PoolResult
	prev := ephemeral.Set{}
	if b, err := os.ReadFile(marker); err == nil {
		if prev, err = ephemeral.ParseSet(strings.TrimSpace(string(b))); err != nil {
			return res, fmt.Errorf("%s: %w", marker, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, err
	}
	err := p.do(func() error {
		return sysctl.Here(func(sd *sysctl.Dir) error {
			cur, err := sd.Read(reservedPortsSysctl)
			if err != nil {
				return err
			}
			res.Original = strings.TrimSpace(cur)
			current, err := ephemeral.ParseSet(res.Original)
			if err != nil {
				return fmt.Errorf("%s: %w", reservedPortsSysctl, err)
			}
			next, ours := MergeReserved(current, prev, pool)
			res.Value, res.Added, res.Removed = next.String(), ours, current.Subtract(next)
			if next.String() == res.Original || (next.Empty() && res.Original == "") {
				res.Value = res.Original
				return nil
			}
			return sd.Write(reservedPortsSysctl, next.String())
		})
	})
	if err != nil {
		return res, fmt.Errorf("host %s: %w", strings.ReplaceAll(reservedPortsSysctl, "/", "."), err)
	}
	if err := writeFileAtomic(marker, res.Added.String()+"\n"); err != nil {
		return res, fmt.Errorf("record the reserved ports: %w", err)
	}
	return res, nil
}
