package isolator

import (
	"fmt"
	"sync"
	"testing"
)

// The keyed mutex serialises one key's holders (the race detector sees an
// unserialised counter) and forgets a key once nobody holds or waits for
// it.
func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	counts := make([]int, 8)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				key := (g + i) % len(counts)
				unlock := k.lock(fmt.Sprint(key))
				counts[key]++
				unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	if total != 16*200 {
		t.Fatalf("%d increments, want %d", total, 16*200)
	}
	for i := range k.shards {
		if n := len(k.shards[i].m); n != 0 {
			t.Fatalf("shard %d keeps %d keys nobody holds", i, n)
		}
	}
}
