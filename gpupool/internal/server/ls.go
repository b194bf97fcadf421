package server

// Listing: the ls op, paged in a stable order with a cursor.

import (
	"container/heap"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// lsPage is the most bytes of buffer entries in one ls reply, leaving
// room for the envelope within ipc.MaxMessage.
const lsPage = ipc.MaxMessage - 4096

// lsKey orders the listing: named buffers by name, then unnamed ones by
// slab and offset. Its cursor form (LsReply.Next) is "n:" + name or
// "u:" + slab and offset in 16 hex digits each, which sorts the same way.
type lsKey struct {
	named bool
	name  string
	slab  uint64
	off   int64
}

func keyOf(a *allocation) lsKey {
	if a.bound {
		return lsKey{named: true, name: a.name}
	}
	return lsKey{slab: a.slab.id, off: a.off}
}

func (k lsKey) less(o lsKey) bool {
	if k.named != o.named {
		return k.named
	}
	if k.named {
		return k.name < o.name
	}
	if k.slab != o.slab {
		return k.slab < o.slab
	}
	return k.off < o.off
}

func (k lsKey) cursor() string {
	if k.named {
		return "n:" + k.name
	}
	return fmt.Sprintf("u:%016x:%016x", k.slab, uint64(k.off))
}

func parseCursor(c string) (lsKey, error) {
	if name, ok := strings.CutPrefix(c, "n:"); ok {
		return lsKey{named: true, name: name}, nil
	}
	bad := fmt.Errorf("%w: ls cursor %q (pass a reply's next as it is)", ipc.ErrBadRequest, c)
	if len(c) != 35 || c[:2] != "u:" || c[18] != ':' {
		return lsKey{}, bad
	}
	slab, err1 := strconv.ParseUint(c[2:18], 16, 64)
	off, err2 := strconv.ParseUint(c[19:], 16, 64)
	if err1 != nil || err2 != nil {
		return lsKey{}, bad
	}
	return lsKey{slab: slab, off: int64(off)}, nil
}

// keyHeap is a max-heap of keys: the page's candidates, largest on top.
type keyHeap []lsEntry

type lsEntry struct {
	k lsKey
	a *allocation
}

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return h[j].k.less(h[i].k) }
func (h keyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *keyHeap) Push(x any)        { *h = append(*h, x.(lsEntry)) }
func (h *keyHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// ls returns one page of the listing: the buffers after req.After, in
// order, as many as fit a reply (and at most req.Limit). It costs
// O(n log k) for n allocations and a page of k, so any number of buffers
// can be listed without a reply growing past a frame.
func (p *Pool) ls(req pool.LsRequest) (pool.LsReply, []int, error) {
	var after lsKey
	if req.After != "" {
		var err error
		if after, err = parseCursor(req.After); err != nil {
			return pool.LsReply{}, nil, err
		}
	}
	// A page holds at most this many entries (the smallest entry is more
	// than 64 bytes).
	most := lsPage / 64
	if req.Limit > 0 {
		most = min(most, req.Limit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := make(keyHeap, 0, min(most, len(p.allocs)))
	more := false // some candidate was left out for the page's size
	for a := range p.allocs {
		k := keyOf(a)
		if req.After != "" && !after.less(k) {
			continue
		}
		if len(h) < most {
			heap.Push(&h, lsEntry{k, a})
			continue
		}
		more = true
		if k.less(h[0].k) {
			h[0] = lsEntry{k, a}
			heap.Fix(&h, 0)
		}
	}
	page := []lsEntry(h)
	sort.Slice(page, func(i, j int) bool { return page[i].k.less(page[j].k) })
	now := time.Now()
	out := make([]pool.BufferInfo, 0, len(page))
	size := 0
	var next string
	for i, e := range page {
		a := e.a
		name := ""
		if a.bound {
			name = a.name
		}
		bi := pool.BufferInfo{
			Name: name, Size: a.size, Slab: a.slab.id, Offset: a.off,
			Leases: a.leases, Kept: a.kept, Sealed: a.sealed, Legacy: a.slab.legacy != nil,
			DType: a.dtype, Shape: a.shape,
			OwnerUID: a.ownerUID, OwnerPID: a.ownerPID, AgeMS: now.Sub(a.created).Milliseconds(),
			Orphan: a.orphan,
		}
		b, err := ipc.MarshalBody(bi)
		if err != nil {
			return pool.LsReply{}, nil, err
		}
		if size+len(b) > lsPage && i > 0 {
			next = page[i-1].k.cursor()
			break
		}
		size += len(b)
		out = append(out, bi)
	}
	if next == "" && more && len(page) > 0 {
		next = page[len(page)-1].k.cursor()
	}
	return pool.LsReply{Buffers: out, Next: next}, nil, nil
}
