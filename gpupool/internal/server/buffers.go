package server

// Buffers: allocations and their leases, names, seals and events (the
// alloc, open, seal, event and free ops), and the release of an
// allocation nothing holds.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

type allocation struct {
	slab     *slab
	off      int64
	size     int64 // bytes asked for
	taken    int64 // aligned bytes taken from the arena
	name     string
	bound    bool // name is bound to this allocation in Pool.names
	leases   int  // connection leases
	kept     bool // the daemon's own lease (AllocRequest.Keep)
	sealed   bool
	dtype    string
	shape    []int64
	created  time.Time
	event    []byte   // CUipcEventHandle set by eventBy
	eventBy  *session // the connection whose process owns the event
	ownerUID uint32
	ownerPID int32
	creator  *session    // while kept and unsealed: the connection that made it (orphans)
	orphan   bool        // kept, unsealed, creator gone: removed by reap
	reap     *time.Timer // removes an orphan after Config.OrphanGrace
}

// release returns a's memory when nothing holds it. Called with p.mu held.
func (p *Pool) release(a *allocation) {
	if a.leases > 0 || a.kept {
		return
	}
	if a.bound && p.names[a.name] == a {
		delete(p.names, a.name)
		p.notify()
	}
	delete(p.allocs, a)
	if a.eventBy != nil {
		delete(a.eventBy.events, a)
	}
	if a.creator != nil {
		delete(a.creator.unsealed, a)
	}
	if err := a.slab.arena.Free(a.off); err != nil {
		p.logf("gpupool: %v", err)
	}
	p.used -= a.taken
	p.traceBytes()
	if p.byUID[a.ownerUID] -= a.taken; p.byUID[a.ownerUID] == 0 {
		delete(p.byUID, a.ownerUID)
	}
	sl := a.slab
	switch {
	case sl.arena.Len() > 0:
	case sl.dedicated:
		p.dropSlab(sl)
	case p.cfg.Idle > 0:
		if sl.idle != nil {
			sl.idle.Stop()
		}
		sl.idle = time.AfterFunc(p.cfg.Idle, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.slabs[sl.id] == sl && sl.arena.Len() == 0 && !p.closed {
				p.logf("gpupool: slab %d idle: released", sl.id)
				p.dropSlab(sl)
			}
		})
	}
}

func checkName(name string) error {
	if len(name) > pool.MaxNameLen {
		return fmt.Errorf("%w: %d bytes (at most %d)", pool.ErrBadName, len(name), pool.MaxNameLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q is not UTF-8", pool.ErrBadName, name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %q has a control character", pool.ErrBadName, name)
		}
	}
	// Names are '/'-separated paths ("run1/params/fc0.weight"): no empty,
	// "." or ".." segment, so a name reads the same everywhere it is shown.
	if name != "" {
		for _, seg := range strings.Split(name, "/") {
			if seg == "" || seg == "." || seg == ".." {
				return fmt.Errorf("%w: %q has an empty, \".\" or \"..\" path segment", pool.ErrBadName, name)
			}
		}
	}
	return nil
}

func checkMeta(dtype string, shape []int64) error {
	if len(dtype) > pool.MaxDTypeLen {
		return fmt.Errorf("%w: dtype of %d bytes (at most %d)", ipc.ErrBadRequest, len(dtype), pool.MaxDTypeLen)
	}
	for _, r := range dtype {
		if r <= 0x20 || r >= 0x7f {
			return fmt.Errorf("%w: dtype %q", ipc.ErrBadRequest, dtype)
		}
	}
	if len(shape) > pool.MaxDims {
		return fmt.Errorf("%w: shape of %d dims (at most %d)", ipc.ErrBadRequest, len(shape), pool.MaxDims)
	}
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("%w: shape %v has a negative dimension", ipc.ErrBadRequest, shape)
		}
	}
	return nil
}

// alloc makes a buffer; deliver is false for a request that wants no
// reply (its lease stays with the connection, but no fd goes out).
func (s *session) alloc(req pool.AllocRequest, deliver bool) (any, []int, error) {
	if req.Size <= 0 || req.Size > MaxAlloc {
		return nil, nil, fmt.Errorf("%w: %d bytes (1 to %d)", pool.ErrBadSize, req.Size, int64(MaxAlloc))
	}
	if err := checkName(req.Name); err != nil {
		return nil, nil, err
	}
	if err := checkMeta(req.DType, req.Shape); err != nil {
		return nil, nil, err
	}
	if req.Keep && req.Name == "" {
		return nil, nil, fmt.Errorf("%w: a kept buffer needs a name", pool.ErrBadName)
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, pool.ErrClosed
	}
	if req.Name != "" && p.names[req.Name] != nil {
		return nil, nil, fmt.Errorf("%w: %q", pool.ErrNameTaken, req.Name)
	}
	if len(s.leases) >= p.cfg.ConnLeases {
		return nil, nil, fmt.Errorf("%w: this connection holds %d leases, the most one may", ipc.ErrLimit, len(s.leases))
	}
	if q, ok := p.cfg.Quota[s.cred.UID]; ok {
		if held := p.byUID[s.cred.UID]; held+device.RoundUp(req.Size, Align) > q {
			return nil, nil, fmt.Errorf("%w: uid %d holds %d of %d bytes, asks %d more", pool.ErrQuota, s.cred.UID, held, q, device.RoundUp(req.Size, Align))
		}
	}
	sl, off, err := p.place(req.Size, s, req.Legacy || p.cfg.LegacyAll)
	if err != nil {
		return nil, nil, err
	}
	a := &allocation{
		slab: sl, off: off, size: req.Size, taken: sl.arena.Round(req.Size),
		name: req.Name, bound: req.Name != "", kept: req.Keep && !p.cfg.Ephemeral,
		sealed: !req.Unsealed || req.Name == "", dtype: req.DType, shape: slices.Clone(req.Shape),
		created:  time.Now(),
		ownerUID: s.cred.UID, ownerPID: s.cred.PID,
	}
	p.allocs[a] = struct{}{}
	if a.kept && !a.sealed {
		a.creator = s
		s.unsealed[a] = struct{}{}
	}
	if a.bound {
		p.names[a.name] = a
	}
	p.used += a.taken
	p.byUID[a.ownerUID] += a.taken
	p.peak = max(p.peak, p.used)
	p.traceBytes()
	lease, fds, err := s.lease(a, deliver)
	if err != nil {
		a.kept = false
		if a.bound {
			delete(p.names, a.name)
			a.bound = false
		}
		p.release(a)
	}
	return lease, fds, err
}

// open leases the named buffer, waiting up to req.WaitMS for its seal. The
// wait ends early when the client hangs up (ipc.WatchHangup): a killed
// client's connection is released at once, not when its wait would end.
func (s *session) open(ctx context.Context, req pool.OpenRequest, deliver bool) (any, []int, error) {
	wait := min(time.Duration(max(req.WaitMS, 0))*time.Millisecond, s.p.cfg.MaxWait)
	deadline := time.Now().Add(wait)
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	var stop func() // of the hang-up watch, once waiting
	defer func() {
		if stop != nil {
			p.waiting--
			stop()
		}
	}()
	for {
		if p.closed {
			return nil, nil, pool.ErrClosed
		}
		a := p.names[req.Name]
		if a == nil {
			return nil, nil, fmt.Errorf("%w: %q", pool.ErrNoSuchName, req.Name)
		}
		if p.cfg.Isolate && a.ownerUID != s.cred.UID {
			return nil, nil, fmt.Errorf("%w: %q belongs to another uid", ipc.ErrPermission, req.Name)
		}
		if a.sealed {
			return s.lease(a, deliver)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil, fmt.Errorf("%w: %q (waited %v)", pool.ErrNotSealed, req.Name, wait)
		}
		if stop == nil {
			p.waiting++
			ctx, stop = ipc.WatchHangup(ctx)
		}
		ch := p.changed
		p.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		p.mu.Lock()
		if ctx.Err() != nil {
			if cause := context.Cause(ctx); errors.Is(cause, ipc.ErrClosed) {
				return nil, nil, fmt.Errorf("%w: open %q: %w", pool.ErrClosed, req.Name, cause)
			}
			return nil, nil, fmt.Errorf("%w: daemon shutting down", pool.ErrClosed)
		}
	}
}

// lease gives the session a handle on a, with the slab's fd if the session
// has not been sent it. With deliver false (a request that wants no
// reply) the lease is made but nothing is sent: no fd (the slab is not
// marked sent) and no released-slab notices. Called with p.mu held.
func (s *session) lease(a *allocation, deliver bool) (any, []int, error) {
	if len(s.leases) >= s.p.cfg.ConnLeases {
		return nil, nil, fmt.Errorf("%w: this connection holds %d leases, the most one may", ipc.ErrLimit, len(s.leases))
	}
	var fds []int
	if deliver && !s.sent[a.slab.id] {
		if len(s.sent) >= s.p.cfg.ConnMaps {
			return nil, nil, fmt.Errorf("%w: this connection was sent %d slabs (their file descriptors), the most one may", ipc.ErrLimit, len(s.sent))
		}
		if a.slab.legacy == nil {
			fd, err := unix.FcntlInt(uintptr(a.slab.s.FD()), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				return nil, nil, fmt.Errorf("gpupool: dup slab fd: %w", err)
			}
			fds = []int{fd}
		}
		s.sent[a.slab.id] = true
	}
	var dropped []uint64
	if deliver {
		dropped = s.dropped
		s.dropped = nil
	}
	s.nextHandle++
	s.leases[s.nextHandle] = a
	a.leases++
	name := ""
	if a.bound {
		name = a.name
	}
	return pool.Lease{
		Handle: s.nextHandle, Name: name, Slab: a.slab.id, SlabSize: a.slab.s.Size(),
		Kind: a.slab.s.Kind(), Offset: a.off, Size: a.size, FD: fds != nil,
		Legacy: a.slab.legacy, Sealed: a.sealed, DType: a.dtype, Shape: a.shape, Event: a.event,
		Dropped: dropped,
	}, fds, nil
}

func (s *session) leased(h uint64) (*allocation, error) {
	a := s.leases[h]
	if a == nil {
		return nil, fmt.Errorf("%w: handle %d", pool.ErrNoSuchLease, h)
	}
	return a, nil
}

func (s *session) seal(h uint64) error {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	a, err := s.leased(h)
	if err != nil {
		return err
	}
	if s.cred.UID != 0 && s.cred.UID != a.ownerUID {
		return fmt.Errorf("%w: %q belongs to uid %d", pool.ErrNotOwner, a.name, a.ownerUID)
	}
	if !a.sealed {
		a.sealed = true
		if a.creator != nil {
			delete(a.creator.unsealed, a)
			a.creator = nil
		}
		p.notify()
	}
	return nil
}

func (s *session) event(req pool.EventRequest) (pool.EventReply, error) {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	a, err := s.leased(req.Handle)
	if err != nil {
		return pool.EventReply{}, err
	}
	if req.IPC != nil {
		if p.cfg.Source.Backend() != "cuda" {
			return pool.EventReply{}, fmt.Errorf("%w: interprocess events need the cuda backend", pool.ErrUnsupported)
		}
		if len(req.IPC) != 64 {
			return pool.EventReply{}, fmt.Errorf("%w: event handle of %d bytes (want 64)", ipc.ErrBadRequest, len(req.IPC))
		}
		if a.eventBy != nil {
			delete(a.eventBy.events, a)
		}
		a.event, a.eventBy = slices.Clone(req.IPC), s
		s.events[a] = struct{}{}
	}
	return pool.EventReply{IPC: a.event}, nil
}

func (s *session) free(req pool.FreeRequest) error {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Name != "" {
		a := p.names[req.Name]
		if a == nil {
			return fmt.Errorf("%w: %q", pool.ErrNoSuchName, req.Name)
		}
		if s.cred.UID != 0 && s.cred.UID != a.ownerUID {
			return fmt.Errorf("%w: %q belongs to uid %d", pool.ErrNotOwner, req.Name, a.ownerUID)
		}
		p.unorphan(a)
		delete(p.names, req.Name)
		p.notify()
		a.bound = false
		a.kept = false
		p.release(a)
		return nil
	}
	a, err := s.leased(req.Handle)
	if err != nil {
		return err
	}
	delete(s.leases, req.Handle)
	a.leases--
	p.release(a)
	return nil
}
