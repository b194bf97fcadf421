package trace

import "sync/atomic"

// ring is a bounded multi-producer multi-consumer queue of preallocated
// Records (D. Vyukov's bounded MPMC queue): a producer claims a slot with one
// CAS and never waits; when the ring is full, put fails at once.
type ring struct {
	mask  uint64
	slots []slot
	_     [56]byte
	tail  atomic.Uint64 // next position to write
	_     [56]byte
	head  atomic.Uint64 // next position to read
}

type slot struct {
	seq atomic.Uint64
	rec Record
}

// newRing returns a ring of n slots, n rounded up to a power of two.
func newRing(n int) *ring {
	size := 1
	for size < n {
		size <<= 1
	}
	r := &ring{mask: uint64(size - 1), slots: make([]slot, size)}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// put copies *rec into the ring; false when it is full.
func (r *ring) put(rec *Record) bool {
	pos := r.tail.Load()
	for {
		s := &r.slots[pos&r.mask]
		seq := s.seq.Load()
		switch {
		case seq == pos:
			if r.tail.CompareAndSwap(pos, pos+1) {
				s.rec = *rec
				s.seq.Store(pos + 1)
				return true
			}
			pos = r.tail.Load()
		case seq < pos:
			return false // full: the slot still holds an unread record
		default:
			pos = r.tail.Load()
		}
	}
}

// get copies the oldest record into *rec; false when the ring is empty.
func (r *ring) get(rec *Record) bool {
	pos := r.head.Load()
	for {
		s := &r.slots[pos&r.mask]
		seq := s.seq.Load()
		switch {
		case seq == pos+1:
			if r.head.CompareAndSwap(pos, pos+1) {
				*rec = s.rec
				s.rec = Record{} // drop string references for the GC
				s.seq.Store(pos + r.mask + 1)
				return true
			}
			pos = r.head.Load()
		case seq < pos+1:
			return false
		default:
			pos = r.head.Load()
		}
	}
}

// len is the number of records waiting (approximate under concurrency).
func (r *ring) len() int {
	return int(r.tail.Load() - r.head.Load())
}
