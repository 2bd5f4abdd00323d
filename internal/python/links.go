package python

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
)

// Links reads context births from the gt_py_links map, for diagnostics and
// tests: for a context, the context that was current when it was copied (its
// creating task, or the callback that created it) and its request root. The
// kernel keys births by address and keeps only the latest, so a lookup for
// an older generation finds nothing; request attribution does not depend on
// this (the root travels in each record). Lookups are cached.
type Links struct {
	lookup func(CtxID) (Link, bool, error)

	mu    sync.Mutex
	cache map[CtxID]Link
}

// maxCached bounds the userspace cache; past it the cache starts over (the
// map in the kernel still has the links).
const maxCached = 1 << 16

// NewLinks reads links from m (gt_py_links).
func NewLinks(m *ebpf.Map) *Links {
	return newLinks(func(id CtxID) (Link, bool, error) {
		var l Link
		err := m.Lookup(id.Addr(), &l)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Link{}, false, nil
		}
		if err != nil {
			return Link{}, false, fmt.Errorf("looking up context link of %s: %w", id, err)
		}
		if l.Gen != id.Gen() {
			return Link{}, false, nil // the address was born again since
		}
		return l, true, nil
	})
}

func newLinks(lookup func(CtxID) (Link, bool, error)) *Links {
	return &Links{lookup: lookup, cache: map[CtxID]Link{}}
}

// Parent returns the link of id, if the probe saw id's birth.
func (ls *Links) Parent(id CtxID) (Link, bool, error) {
	if id == 0 {
		return Link{}, false, nil
	}
	ls.mu.Lock()
	l, ok := ls.cache[id]
	ls.mu.Unlock()
	if ok {
		return l, true, nil
	}
	l, ok, err := ls.lookup(id)
	if err != nil || !ok {
		return Link{}, false, err
	}
	ls.mu.Lock()
	if len(ls.cache) >= maxCached {
		ls.cache = map[CtxID]Link{}
	}
	ls.cache[id] = l
	ls.mu.Unlock()
	return l, true, nil
}

// Ancestors returns id followed by its creators, nearest first, at most max
// entries. The chain ends where a context's birth was not seen (the
// process's first contexts, contexts born before the probe was attached) or
// at a cycle (a recycled address whose new birth was not seen).
func (ls *Links) Ancestors(id CtxID, max int) ([]CtxID, error) {
	if id == 0 || max <= 0 {
		return nil, nil
	}
	out := []CtxID{id}
	seen := map[CtxID]bool{id: true}
	for len(out) < max {
		l, ok, err := ls.Parent(out[len(out)-1])
		if err != nil {
			return out, err
		}
		if !ok || l.Parent == 0 || seen[l.Parent] {
			break
		}
		seen[l.Parent] = true
		out = append(out, l.Parent)
	}
	return out, nil
}

// Forget drops cached links (e.g. when a traced process exits).
func (ls *Links) Forget() {
	ls.mu.Lock()
	ls.cache = map[CtxID]Link{}
	ls.mu.Unlock()
}
