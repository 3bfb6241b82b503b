package isolator

import (
	"hash/maphash"
	"sync"
)

// keyedShards is how many independent tables keyedMutex spreads its keys
// over.
const keyedShards = 64

// keyedMutex serializes calls per container ID. The table of a key's lock
// is guarded by one of keyedShards mutexes, chosen by the key's hash, so a
// call for one container (a Usage) does not queue for that table behind
// the calls of a burst for other containers.
type keyedMutex struct {
	once   sync.Once
	seed   maphash.Seed
	shards [keyedShards]keyedShard
}

type keyedShard struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) shard(key string) *keyedShard {
	k.once.Do(func() { k.seed = maphash.MakeSeed() })
	return &k.shards[maphash.String(k.seed, key)%keyedShards]
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	sh := k.shard(key)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[string]*keyedEntry{}
	}
	e := sh.m[key]
	if e == nil {
		e = &keyedEntry{}
		sh.m[key] = e
	}
	e.refs++
	sh.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		sh.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(sh.m, key)
		}
		sh.mu.Unlock()
	}
}
