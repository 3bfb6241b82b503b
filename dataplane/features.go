package dataplane

import (
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/isolatord/isolatord/isolator/plane"
	"github.com/isolatord/isolatord/netns/nshandle"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// configSymbols maps each feature to the kernel config symbol that provides it.
var configSymbols = map[string]string{
	plane.FeatureClsact:  "CONFIG_NET_SCH_INGRESS",
	plane.FeatureU32:     "CONFIG_NET_CLS_U32",
	plane.FeatureMirred:  "CONFIG_NET_ACT_MIRRED",
	plane.FeatureHTB:     "CONFIG_NET_SCH_HTB",
	plane.FeatureTBF:     "CONFIG_NET_SCH_TBF",
	plane.FeatureIFB:     "CONFIG_IFB",
	plane.FeatureFQCodel: "CONFIG_NET_SCH_FQ_CODEL",
}

// detectFeatures finds which traffic-control features the kernel has. It
// probes each one for real inside a throwaway network namespace (so nothing
// on the host changes, and modules get loaded on demand as they would for the
// daemon). Where the probe cannot run, /proc/config.gz decides ("=y" or "=m").
// It returns the feature map and where the answers came from.
func detectFeatures() (map[string]bool, string) {
	feats, err := probeFeatures()
	if err == nil {
		return feats, "probe"
	}
	if cfg, cerr := readKernelConfig("/proc/config.gz"); cerr == nil {
		feats = map[string]bool{}
		for f, sym := range configSymbols {
			v := cfg[sym]
			feats[f] = v == "y" || v == "m"
		}
		return feats, "/proc/config.gz"
	}
	return map[string]bool{}, "unknown (" + err.Error() + ")"
}

func readKernelConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	}
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "CONFIG_") {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// probeFeatures tries each feature on the loopback of a fresh namespace.
func probeFeatures() (map[string]bool, error) {
	ns, err := nshandle.New()
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := ns.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return nil, err
	}
	idx := lo.Attrs().Index
	feats := map[string]bool{}

	root := func(q netlink.Qdisc) bool {
		if err := h.QdiscAdd(q); err != nil {
			return false
		}
		h.QdiscDel(q)
		return true
	}
	clsact := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)},
		QdiscType:  "clsact",
	}
	if err := h.QdiscAdd(clsact); err == nil {
		feats[plane.FeatureClsact] = true
		// u32 with a mirred action, under clsact ingress.
		u := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 1, Protocol: unix.ETH_P_IP},
			Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{Off: 16, Val: 0x7f000063, Mask: 0xffffffff}}},
		}
		if h.FilterAdd(u) == nil {
			feats[plane.FeatureU32] = true
			h.FilterDel(u)
			m := &netlink.U32{
				FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 2, Protocol: unix.ETH_P_IP},
				Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{Off: 16, Val: 0x7f000063, Mask: 0xffffffff}}},
				Actions:     []netlink.Action{netlink.NewMirredAction(idx)},
			}
			feats[plane.FeatureMirred] = h.FilterAdd(m) == nil
		}
		h.QdiscDel(clsact)
	}
	feats[plane.FeatureHTB] = root(netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: idx, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}))
	feats[plane.FeatureTBF] = root(&netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)},
		Rate:       1 << 20, Limit: 1 << 16, Buffer: 1 << 14,
	})
	feats[plane.FeatureFQCodel] = root(netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: idx, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}))
	ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "isoprobe0"}}
	if h.LinkAdd(ifb) == nil {
		feats[plane.FeatureIFB] = true
		h.LinkDel(ifb)
	}
	return feats, nil
}

// missingFeatures lists the features that are absent, sorted.
func missingFeatures(f map[string]bool) []string {
	var out []string
	for name := range configSymbols {
		if !f[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
