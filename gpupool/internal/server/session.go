package server

// Sessions: one per connection, dispatching its requests and giving back
// what it held when it ends.

import (
	"context"
	"fmt"
	"os"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/trace"
)

// session is one connection's view: its peer, its leases by handle, which
// slabs' fds it has been sent, and the events it set.
type session struct {
	p          *Pool
	cred       ipc.Cred
	nextHandle uint64
	leases     map[uint64]*allocation
	sent       map[uint64]bool // slabs whose fd (or legacy handle) it has
	dropped    []uint64        // sent slabs released since the last lease or free reply sent
	events     map[*allocation]struct{}
	trk        *trace.Track       // its row on the trace (nil: tracing off)
	own        map[*slab]struct{} // live dedicated slabs it made
	// unsealed holds the kept, unsealed buffers it made: orphans if it
	// ends before sealing them.
	unsealed map[*allocation]struct{}
}

// Handle implements ipc.Session.
//
// With tracing on, each request is a span named by its op on the
// connection's track, the incoming end of the request's flow.
func (s *session) Handle(ctx context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	sp := s.trk.Begin(traceCategory, m.Op)
	sp.FlowIn(m.Flow)
	defer sp.End()
	switch m.Op {
	case pool.OpHello:
		var req pool.HelloRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		_, legacy := s.p.cfg.Source.(LegacySource)
		r := pool.HelloReply{
			Server: "gpupool", Protocol: ipc.Version, PID: os.Getpid(), Backend: s.p.cfg.Source.Backend(),
			Share: s.p.shareKind(), SlabSize: s.p.cfg.SlabSize, Align: Align, UID: s.cred.UID, Legacy: legacy,
			NoReply: true,
		}
		if o, ok := s.p.cfg.Source.(interface{ Ordinal() int }); ok {
			r.Device = o.Ordinal()
		}
		return r, nil, nil
	case pool.OpAlloc:
		var req pool.AllocRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return s.alloc(req, !m.NoReply)
	case pool.OpOpen:
		var req pool.OpenRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return s.open(ctx, req, !m.NoReply)
	case pool.OpSeal:
		var req pool.SealRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.seal(req.Handle)
	case pool.OpEvent:
		var req pool.EventRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		r, err := s.event(req)
		return r, nil, err
	case pool.OpFree:
		var req pool.FreeRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		if err := s.free(req); err != nil {
			return nil, nil, err
		}
		if m.NoReply {
			// Released slabs wait for the next reply.
			return nil, nil, nil
		}
		s.p.mu.Lock()
		r := pool.FreeReply{Dropped: s.dropped}
		s.dropped = nil
		s.p.mu.Unlock()
		return r, nil, nil
	case pool.OpLs:
		var req pool.LsRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return s.p.ls(req)
	case pool.OpStats:
		return s.p.Stats(), nil, nil
	}
	return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
}

// Close implements ipc.Session: the connection's leases are dropped, and
// the events its process owned are forgotten (they die with it).
func (s *session) Close() {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for a := range s.events {
		if a.eventBy == s {
			a.event, a.eventBy = nil, nil
		}
	}
	s.events = nil
	// Kept buffers it left unsealed can never be sealed now: orphans.
	for a := range s.unsealed {
		delete(s.unsealed, a)
		a.creator = nil
		if a.kept && !a.sealed && a.bound && !p.closed {
			p.orphan(a)
		}
	}
	// Its slabs of their own that outlive it (kept buffers) are no one's.
	for sl := range s.own {
		sl.creator = nil
	}
	s.own = nil
	for h, a := range s.leases {
		delete(s.leases, h)
		a.leases--
		p.release(a)
	}
	delete(p.sessions, s)
}
