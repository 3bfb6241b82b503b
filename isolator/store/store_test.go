package store

import (
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCorruptStateMovedAside: a state file damaged in any of several ways
// opens as an empty state (to be rebuilt from the kernel), without a
// panic, with the bad file moved aside and the fault named.
func TestCorruptStateMovedAside(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a dozen corrupt databases, ~10 s on a busy machine: skipped with -short")
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	faults := map[string]func(t *testing.T, path string){
		"truncated": func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()/3); err != nil {
				t.Fatal(err)
			}
		},
		"tiny": func(t *testing.T, path string) {
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		},
		"garbage": func(t *testing.T, path string) {
			b := make([]byte, 64<<10)
			rand.New(rand.NewSource(1)).Read(b)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	// random pages (beyond the two meta pages) overwritten, several seeds
	for seed := int64(1); seed <= 6; seed++ {
		faults["pages-"+string(rune('0'+seed))] = func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewSource(seed))
			pages := len(b) / 4096
			for i := 0; i < 3 && pages > 2; i++ {
				p := 2 + rng.Intn(pages-2)
				rng.Read(b[p*4096 : p*4096+4096])
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, damage := range faults {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			st, err := openStore(dir, log)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 300; i++ {
				r := &rec{ID: "c" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + filepath.Base(dir) + string(rune('0'+i%10)), State: statePrepared, Slot: uint16(i + 1)}
				r.ID = r.ID + "-" + string(rune('a'+(i/26)%26)) + string(rune('a'+i%26))
				if err := st.Put(r); err != nil {
					t.Fatal(err)
				}
			}
			st.Close()
			path := filepath.Join(dir, "isolatord.db")
			damage(t, path)
			st, err = openStore(dir, log)
			if err != nil {
				t.Fatalf("open damaged state: %v", err)
			}
			defer st.Close()
			recs, err := st.Load()
			if err != nil {
				t.Fatal(err)
			}
			if st.movedAside == "" {
				// Damage that bbolt cannot see (a free page) is fine as long
				// as every record still reads.
				if len(recs) != 300 {
					t.Fatalf("not moved aside, yet %d of 300 records", len(recs))
				}
				return
			}
			if len(recs) != 0 {
				t.Fatalf("fresh state after moving aside has %d records", len(recs))
			}
			if _, err := os.Stat(st.movedAside); err != nil || !strings.HasPrefix(filepath.Base(st.movedAside), "isolatord.db.corrupt-") {
				t.Fatalf("moved aside to %q: %v", st.movedAside, err)
			}
			if st.fault == "" {
				t.Fatal("fault not named")
			}
			t.Logf("fault: %s", st.fault)
		})
	}
}

// TestStateOpenErrorsNameTheCause: a file system error is not called
// corruption (nothing moved) nor blamed on another isolatord.
func TestStateOpenErrorsNameTheCause(t *testing.T) {
	if os.Geteuid() == 0 {
		// root ignores permissions; use a path under a regular file instead
		dir := t.TempDir()
		f := filepath.Join(dir, "file")
		os.WriteFile(f, nil, 0o600)
		_, err := openStore(filepath.Join(f, "state"), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || strings.Contains(err.Error(), "another isolatord") || !strings.Contains(err.Error(), "not a directory") {
			t.Fatalf("got %v", err)
		}
		return
	}
	t.Skip("needs root for the not-a-directory case layout")
}
