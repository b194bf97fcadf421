package server

// The pool's slabs: where an allocation goes (best fit over the shared
// slabs, or a slab of its own), making slabs within Limit and MaxSlabs, and
// releasing empty ones. Slab sources are in slab.go.

import (
	"fmt"
	"time"

	"gpukit/gpupool/internal/arena"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/trace"
)

type slab struct {
	id        uint64
	s         Slab
	arena     *arena.Arena
	dedicated bool   // holds one large (or legacy) allocation; closed when it is freed
	legacy    []byte // CUipcMemHandle of a legacy slab
	uid       uint32 // owner under Config.Isolate
	idle      *time.Timer
	creator   *session // of a dedicated slab: the connection that made it
}

// place finds room for n bytes for uid: the best fit over the shared slabs
// (of that uid under Isolate), else a new shared slab, or a slab of its own
// when n exceeds the slab size or legacy is set. Called with p.mu held.
func (p *Pool) place(n int64, sess *session, legacy bool) (*slab, int64, error) {
	uid := sess.cred.UID
	taken := device.RoundUp(n, Align)
	if legacy || taken > p.cfg.SlabSize {
		if len(sess.own) >= p.cfg.ConnSlabs {
			return nil, 0, fmt.Errorf("%w: this connection holds %d slabs of its own (large or legacy buffers), the most one may", ipc.ErrLimit, len(sess.own))
		}
		s, err := p.newSlab(taken, true, legacy, uid)
		if err != nil {
			return nil, 0, err
		}
		s.creator = sess
		sess.own[s] = struct{}{}
		off, err := s.arena.Alloc(n)
		return s, off, err
	}
	var best *slab
	var bestHole int64
	for _, s := range p.slabs {
		if s.dedicated || (p.cfg.Isolate && s.uid != uid) {
			continue
		}
		if hole, ok := s.arena.Fit(n); ok && (best == nil || hole < bestHole || (hole == bestHole && s.id < best.id)) {
			best, bestHole = s, hole
		}
	}
	if best == nil {
		s, err := p.newSlab(p.cfg.SlabSize, false, false, uid)
		if err != nil {
			return nil, 0, err
		}
		best = s
	}
	if best.idle != nil {
		best.idle.Stop()
		best.idle = nil
	}
	off, err := best.arena.Alloc(n)
	return best, off, err
}

// newSlab makes a slab of at least size bytes, within Limit: empty shared
// slabs are released first when the limit (or the source) says there is no
// room. Called with p.mu held.
func (p *Pool) newSlab(size int64, dedicated, legacy bool, uid uint32) (*slab, error) {
	var ls LegacySource
	if legacy {
		var ok bool
		if ls, ok = p.cfg.Source.(LegacySource); !ok {
			return nil, fmt.Errorf("%w: legacy IPC buffers need the cuda backend (this daemon runs %s)", pool.ErrUnsupported, p.cfg.Source.Backend())
		}
	} else {
		size = device.RoundUp(size, p.cfg.Source.Granularity())
	}
	if lim := p.cfg.Limit; lim > 0 && p.reserved+size > lim {
		p.dropEmpty()
		if p.reserved+size > lim {
			return nil, fmt.Errorf("%w: %d bytes reserved of a %d-byte limit, a slab of %d more does not fit", pool.ErrNoMemory, p.reserved, lim, size)
		}
	}
	if len(p.slabs) >= p.cfg.MaxSlabs {
		p.dropEmpty()
		if len(p.slabs) >= p.cfg.MaxSlabs {
			return nil, fmt.Errorf("%w: the daemon holds %d slabs, its most (one file descriptor each, within its limit of %d)", ipc.ErrLimit, len(p.slabs), ipc.FDLimit())
		}
	}
	mk := func() (Slab, error) {
		if legacy {
			return ls.NewLegacy(size)
		}
		return p.cfg.Source.NewSlab(size)
	}
	sl, err := mk()
	if err != nil && p.dropEmpty() {
		sl, err = mk()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", pool.ErrNoMemory, err)
	}
	p.nextSlab++
	s := &slab{id: p.nextSlab, s: sl, arena: arena.New(sl.Size(), Align), dedicated: dedicated, uid: uid}
	if h, ok := sl.(interface{ IPCHandle() [64]byte }); ok && sl.Kind() == device.ShareLegacyIPC {
		hh := h.IPCHandle()
		s.legacy = hh[:]
	}
	p.slabs[s.id] = s
	p.reserved += sl.Size()
	p.traceBytes()
	p.logf("gpupool: slab %d: %d bytes (%s)", s.id, sl.Size(), sl.Kind())
	return s, nil
}

// dropEmpty releases every empty shared slab and reports whether it
// released any. Called with p.mu held.
func (p *Pool) dropEmpty() bool {
	dropped := false
	for _, s := range p.slabs {
		if !s.dedicated && s.arena.Len() == 0 {
			p.dropSlab(s)
			dropped = true
		}
	}
	return dropped
}

// traceBytes samples the reserved and used counters on the trace (nothing
// when tracing is off). Called with p.mu held, after they change.
func (p *Pool) traceBytes() {
	if t := trace.Default(); t != nil {
		t.Counter(counterReserved, float64(p.reserved))
		t.Counter(counterUsed, float64(p.used))
	}
}

func (p *Pool) dropSlab(s *slab) {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	if s.creator != nil {
		delete(s.creator.own, s)
		s.creator = nil
	}
	delete(p.slabs, s.id)
	p.reserved -= s.s.Size()
	p.traceBytes()
	for sess := range p.sessions {
		if sess.sent[s.id] {
			delete(sess.sent, s.id)
			sess.dropped = append(sess.dropped, s.id)
		}
	}
	if err := s.s.Close(); err != nil {
		p.logf("gpupool: close slab %d: %v", s.id, err)
	}
}
