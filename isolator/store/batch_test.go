package store

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestGroupCommit: concurrent writes all land (sharing transactions), and a
// write that fails inside a shared transaction fails alone.
func TestGroupCommit(t *testing.T) {
	st, err := openStore(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	bad := errors.New("bad write")
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%16 == 5 {
				errs[i] = st.update(func(*bolt.Tx) error { return bad })
				return
			}
			errs[i] = st.Put(&rec{ID: fmt.Sprintf("c%02d", i), State: statePrepared})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%16 == 5 {
			if !errors.Is(err, bad) {
				t.Errorf("write %d: %v, want the bad write's error", i, err)
			}
		} else if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	recs, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if want := n - n/16; len(recs) != want {
		t.Errorf("%d records stored, want %d", len(recs), want)
	}
	for i := 0; i < n; i += 2 {
		if i%16 != 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := st.Del(fmt.Sprintf("c%02d", i)); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	if recs, _ = st.Load(); len(recs) != n-n/16-n/2 {
		t.Errorf("%d records after deleting the even ones, want %d", len(recs), n-n/16-n/2)
	}
}
