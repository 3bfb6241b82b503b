package main

import (
	"fmt"

	pb "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/dataplane"
	"github.com/isolatord/isolatord/metrics"
	"github.com/isolatord/isolatord/tcfilter/fragbpf"
)

// Fragment steering (issue 32): the data plane's counters for metrics and
// Status.

func fragmentMetrics(dp *dataplane.DataPlane) func() (metrics.Fragments, error) {
	return func() (metrics.Fragments, error) {
		st, err := dp.Fragments()
		if err != nil {
			return metrics.Fragments{}, err
		}
		return metrics.Fragments{Enabled: st.Enabled, Steered4: st.Steered4, Steered6: st.Steered6,
			Host4: st.Host4, Host6: st.Host6, Evicted: st.Evicted, Entries: st.Entries}, nil
	}
}

func fragmentStatus(dp *dataplane.DataPlane) func() *pb.FragmentSteering {
	return func() *pb.FragmentSteering {
		st, err := dp.Fragments()
		if err != nil {
			return nil
		}
		return &pb.FragmentSteering{Enabled: st.Enabled, SteeredIpv4: st.Steered4, SteeredIpv6: st.Steered6,
			ToHostIpv4: st.Host4, ToHostIpv6: st.Host6, TableEvictions: st.Evicted,
			TableEntries: st.Entries, TableSize: uint32(st.Size)}
	}
}

// fragmentsFn reads the fragment steering's counters for Status.
type fragmentsFn = func() *pb.FragmentSteering

// checkFragTableSize checks --fragment-table-size (0: the default;
// negative: off).
func checkFragTableSize(n int) error {
	if n > 0 && (n < fragbpf.MinSize || n > fragbpf.MaxSize) {
		return fmt.Errorf("--fragment-table-size %d: must be %d..%d (0: %d; negative: no fragment steering)",
			n, fragbpf.MinSize, fragbpf.MaxSize, fragbpf.DefaultSize)
	}
	return nil
}
