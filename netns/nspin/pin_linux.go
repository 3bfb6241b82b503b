package nspin

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/isolatord/isolatord/netns/nshandle"
)

// Create pins ns under dir for the container called name:
//   - dir/name already pins ns (a runtime pinned it there): that pin is
//     used, not owned;
//   - dir/name is free: ns is bind-mounted there, owned;
//   - dir/name is taken by anything else (a pin of another namespace, a
//     file): ns is bind-mounted at dir/name+Suffix, owned, and the
//     other mount is left alone.
func Create(ns *nshandle.NS, dir, name string) (Pin, error) {
	p := filepath.Join(dir, name)
	plan := Plan(ns, dir, name)
	if !plan.Owned {
		return plan, nil
	}
	if plan.Path != p {
		alt, err := BindMount(ns, dir, name+Suffix)
		if err != nil {
			return Pin{}, fmt.Errorf("%s is taken (another namespace's pin or a file), and the alternate pin failed: %w", p, err)
		}
		return Pin{Path: alt, Owned: true}, nil
	}
	got, err := BindMount(ns, dir, name)
	if err != nil {
		alt, aerr := BindMount(ns, dir, name+Suffix)
		if aerr != nil {
			return Pin{}, fmt.Errorf("%w (alternate pin: %v)", err, aerr)
		}
		return Pin{Path: alt, Owned: true}, nil
	}
	return Pin{Path: got, Owned: true}, nil
}

// Plan says where Create would pin ns for name and whether the pin
// would be isolatord's, changing nothing: the lifecycle records it in its
// intent before Setup, so that recovery from a crash in between knows
// whose pin it finds.
func Plan(ns *nshandle.NS, dir, name string) Pin {
	p := filepath.Join(dir, name)
	if cur, err := nshandle.Open(p); err == nil {
		same := cur.SameAs(ns)
		cur.Close()
		if same {
			return Pin{Path: p}
		}
		return Pin{Path: p + Suffix, Owned: true}
	}
	if st, err := os.Lstat(p); err == nil && !(st.Mode().IsRegular() && st.Size() == 0) {
		return Pin{Path: p + Suffix, Owned: true} // not a file BindMount can reuse
	}
	return Pin{Path: p, Owned: true}
}

// Remove removes pin when isolatord owns it (see Unmount); a pin it does
// not own is never touched (mounted and existed are then false).
func Remove(pin Pin) (mounted, existed bool, err error) {
	if !pin.Owned || pin.Path == "" {
		return false, false, nil
	}
	return Unmount(filepath.Dir(pin.Path), filepath.Base(pin.Path))
}
