package isolator

import (
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestStorePinOwned: pin ownership survives the store, and records written
// before it was recorded load as owned (isolatord made every pin then).
func TestStorePinOwned(t *testing.T) {
	s, err := openStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for _, r := range []*Record{
		{ID: "theirs", State: StateIsolated, Mount: "/var/run/netns/theirs", PinOwned: false},
		{ID: "ours", State: StateIsolated, Mount: "/var/run/netns/ours@isolatord", PinOwned: true},
	} {
		if err := s.put(r); err != nil {
			t.Fatal(err)
		}
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).Put([]byte("old"), []byte(`{"id":"old","state":"isolated","mount":"/var/run/netns/old"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.load()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"theirs": false, "ours": true, "old": true}
	if len(rs) != len(want) {
		t.Fatalf("loaded %d records", len(rs))
	}
	for _, r := range rs {
		if r.PinOwned != want[r.ID] {
			t.Errorf("%s: PinOwned %v, want %v", r.ID, r.PinOwned, want[r.ID])
		}
	}
}
