package metrics

import (
	"testing"
)

type fakeRecovery struct {
	unattributed []string
	rebuilt      int
}

func (f *fakeRecovery) Unattributed() []string { return f.unattributed }
func (f *fakeRecovery) RebuiltCount() int      { return f.rebuilt }

// TestRecoverySeries: both series exist from zero and follow the source.
func TestRecoverySeries(t *testing.T) {
	m := New("test")
	src := &fakeRecovery{}
	m.WatchRecovery(src)
	get := func(name string) float64 {
		t.Helper()
		fams, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	if get("isolatord_unattributed_kernel_objects") != 0 || get("isolatord_recovery_rebuilt_containers") != 0 {
		t.Fatal("not zero at start")
	}
	src.unattributed = []string{"veth iso0123456789ab", "eth0 range 1-2 of slot 3"}
	src.rebuilt = 7
	if get("isolatord_unattributed_kernel_objects") != 2 || get("isolatord_recovery_rebuilt_containers") != 7 {
		t.Fatal("series do not follow the source")
	}
}
