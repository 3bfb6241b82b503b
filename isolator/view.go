package isolator

import (
	"sort"
	"sync"
)

// recordView is the container records as reads see them: a copy of each
// record as last published, read without s.mu. Under a burst of setups and
// teardowns s.mu is short-held but wanted by every call, and a read
// queueing for it waits for each goroutine ahead of it to be scheduled;
// a read of the view waits for nobody. The view changes only where
// s.records does, under s.mu (so the two never disagree for longer than
// that critical section), and is rebuilt from s.records once recovery,
// which changes records in place before any call is served, is done.
// A stored *Record is never modified.
type recordView struct {
	m sync.Map // container ID -> *Record
}

// show publishes a copy of r.
func (v *recordView) show(r *Record) {
	c := *r
	v.m.Store(c.ID, &c)
}

// hide removes id's record.
func (v *recordView) hide(id string) { v.m.Delete(id) }

// get returns id's record.
func (v *recordView) get(id string) (Record, bool) {
	x, ok := v.m.Load(id)
	if !ok {
		return Record{}, false
	}
	return *x.(*Record), true
}

// all returns every record, sorted by ID.
func (v *recordView) all() []Record {
	var out []Record
	v.m.Range(func(_, x any) bool {
		out = append(out, *x.(*Record))
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// each calls fn with every record, in no order; fn must not change it.
func (v *recordView) each(fn func(r *Record)) {
	v.m.Range(func(_, x any) bool {
		fn(x.(*Record))
		return true
	})
}

// reset makes the view exactly records; the caller holds s.mu.
func (v *recordView) reset(records map[string]*Record) {
	v.m.Range(func(id, _ any) bool {
		if _, ok := records[id.(string)]; !ok {
			v.m.Delete(id)
		}
		return true
	})
	for _, r := range records {
		v.show(r)
	}
}
