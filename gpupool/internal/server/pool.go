package server

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/gpupool/internal/arena"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// Align is the alignment of every allocation's offset and length in bytes.
const Align = 256

// MaxAlloc is the largest single allocation in bytes (1 TiB): a bound on
// what a bad request can ask of the kernel.
const MaxAlloc = 1 << 40

// DefaultSlabSize is the size of a shared slab (64 MiB).
const DefaultSlabSize = 64 << 20

// Config is what the daemon is told at start.
type Config struct {
	Source   SlabSource // nil: Memfd
	SlabSize int64      // shared slab size in bytes; 0: DefaultSlabSize
	// Quota bounds the bytes (aligned) that the buffers created by a uid
	// may hold at once; uids not in the map are unbounded.
	Quota map[uint32]int64
	// AllowUID, when non-nil, lists the only uids (SO_PEERCRED) that may
	// connect; others get ErrPermission. The daemon's own uid is not implied.
	AllowUID []uint32
	// Idle, when positive, releases a shared slab that has stayed empty
	// this long; 0 keeps empty shared slabs for reuse.
	Idle time.Duration
	// Logf, if set, gets one line per notable event.
	Logf func(format string, args ...any)
}

// Pool is the daemon's state. Its methods are safe for concurrent use; each
// connection's session calls into it under one lock.
type Pool struct {
	cfg Config

	mu       sync.Mutex
	nextSlab uint64
	slabs    map[uint64]*slab
	allocs   map[*allocation]struct{}
	names    map[string]*allocation
	sessions map[*session]struct{}
	used     int64
	peak     int64
	reserved int64
	byUID    map[uint32]int64 // bytes held by buffers each uid created
	closed   bool
}

type slab struct {
	id        uint64
	s         Slab
	arena     *arena.Arena
	dedicated bool // holds one large allocation; closed when it is freed
	idle      *time.Timer
}

type allocation struct {
	slab     *slab
	off      int64
	size     int64 // bytes asked for
	taken    int64 // aligned bytes taken from the arena
	name     string
	bound    bool // name is bound to this allocation in Pool.names
	leases   int  // connection leases
	kept     bool // the daemon's own lease (AllocRequest.Keep)
	ownerUID uint32
	ownerPID int32
}

// New returns an empty pool.
func New(cfg Config) *Pool {
	if cfg.Source == nil {
		cfg.Source = Memfd{}
	}
	if cfg.SlabSize <= 0 {
		cfg.SlabSize = DefaultSlabSize
	}
	cfg.SlabSize = device.RoundUp(cfg.SlabSize, cfg.Source.Granularity())
	return &Pool{
		cfg:      cfg,
		slabs:    map[uint64]*slab{},
		allocs:   map[*allocation]struct{}{},
		names:    map[string]*allocation{},
		sessions: map[*session]struct{}{},
		byUID:    map[uint32]int64{},
	}
}

func (p *Pool) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}

// Connect implements ipc.Handler.
func (p *Pool) Connect(c *ipc.Conn) (ipc.Session, error) {
	cred, err := c.PeerCred()
	if err != nil {
		return nil, err
	}
	if p.cfg.AllowUID != nil && !slices.Contains(p.cfg.AllowUID, cred.UID) {
		p.logf("gpupool: refused uid %d (pid %d)", cred.UID, cred.PID)
		return nil, fmt.Errorf("%w: uid %d may not use this pool", ipc.ErrPermission, cred.UID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, pool.ErrClosed
	}
	s := &session{p: p, cred: cred, leases: map[uint64]*allocation{}, sent: map[uint64]bool{}}
	p.sessions[s] = struct{}{}
	return s, nil
}

// Stats returns the pool's counters.
func (p *Pool) Stats() pool.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pool.Stats{
		Reserved: p.reserved, Used: p.used, Free: p.reserved - p.used, Peak: p.peak,
		Slabs: len(p.slabs), Clients: len(p.sessions), Allocations: len(p.allocs), Named: len(p.names),
	}
}

// Close releases every slab. Call it after the ipc.Server has shut down.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var first error
	for id, s := range p.slabs {
		if err := s.s.Close(); err != nil && first == nil {
			first = err
		}
		delete(p.slabs, id)
	}
	p.reserved = 0
	return first
}

// place finds room for n bytes: the best fit over the shared slabs, else a
// new shared slab, or a slab of its own when n exceeds the slab size.
// Called with p.mu held.
func (p *Pool) place(n int64) (*slab, int64, error) {
	taken := device.RoundUp(n, Align)
	if taken > p.cfg.SlabSize {
		s, err := p.newSlab(device.RoundUp(taken, p.cfg.Source.Granularity()), true)
		if err != nil {
			return nil, 0, err
		}
		off, err := s.arena.Alloc(n)
		return s, off, err
	}
	var best *slab
	var bestHole int64
	for _, s := range p.slabs {
		if s.dedicated {
			continue
		}
		if hole, ok := s.arena.Fit(n); ok && (best == nil || hole < bestHole || (hole == bestHole && s.id < best.id)) {
			best, bestHole = s, hole
		}
	}
	if best == nil {
		s, err := p.newSlab(p.cfg.SlabSize, false)
		if err != nil {
			return nil, 0, err
		}
		best = s
	}
	off, err := best.arena.Alloc(n)
	return best, off, err
}

func (p *Pool) newSlab(size int64, dedicated bool) (*slab, error) {
	sl, err := p.cfg.Source.NewSlab(size)
	if err != nil {
		return nil, err
	}
	p.nextSlab++
	s := &slab{id: p.nextSlab, s: sl, arena: arena.New(sl.Size(), Align), dedicated: dedicated}
	p.slabs[s.id] = s
	p.reserved += sl.Size()
	p.logf("gpupool: slab %d: %d bytes", s.id, sl.Size())
	return s, nil
}

// release returns a's memory when nothing holds it. Called with p.mu held.
func (p *Pool) release(a *allocation) {
	if a.leases > 0 || a.kept {
		return
	}
	if a.bound && p.names[a.name] == a {
		delete(p.names, a.name)
	}
	delete(p.allocs, a)
	if err := a.slab.arena.Free(a.off); err != nil {
		p.logf("gpupool: %v", err)
	}
	p.used -= a.taken
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

func (p *Pool) dropSlab(s *slab) {
	delete(p.slabs, s.id)
	p.reserved -= s.s.Size()
	for sess := range p.sessions {
		delete(sess.sent, s.id)
	}
	if err := s.s.Close(); err != nil {
		p.logf("gpupool: close slab %d: %v", s.id, err)
	}
}

// session is one connection's view: its peer, its leases by handle, and
// which slabs' fds it has been sent.
type session struct {
	p          *Pool
	cred       ipc.Cred
	nextHandle uint64
	leases     map[uint64]*allocation
	sent       map[uint64]bool
}

// Handle implements ipc.Session.
func (s *session) Handle(_ context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	switch m.Op {
	case pool.OpHello:
		var req pool.HelloRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return pool.HelloReply{
			Server: "gpupool", PID: os.Getpid(), Backend: s.p.cfg.Source.Backend(),
			Share: s.p.shareKind(), SlabSize: s.p.cfg.SlabSize, Align: Align, UID: s.cred.UID,
		}, nil, nil
	case pool.OpAlloc:
		var req pool.AllocRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return s.alloc(req)
	case pool.OpOpen:
		var req pool.OpenRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return s.open(req.Name)
	case pool.OpFree:
		var req pool.FreeRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return nil, nil, s.free(req)
	case pool.OpLs:
		return s.p.ls(), nil, nil
	case pool.OpStats:
		return s.p.Stats(), nil, nil
	}
	return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
}

func (p *Pool) shareKind() device.ShareKind {
	if p.cfg.Source.Backend() == "cuda" {
		return device.ShareVMM
	}
	return device.ShareMemfd
}

func checkName(name string) error {
	if len(name) > pool.MaxNameLen {
		return fmt.Errorf("%w: %d bytes (at most %d)", pool.ErrBadName, len(name), pool.MaxNameLen)
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

func (s *session) alloc(req pool.AllocRequest) (any, []int, error) {
	if req.Size <= 0 || req.Size > MaxAlloc {
		return nil, nil, fmt.Errorf("%w: %d bytes (1 to %d)", pool.ErrBadSize, req.Size, int64(MaxAlloc))
	}
	if err := checkName(req.Name); err != nil {
		return nil, nil, err
	}
	if req.Keep && req.Name == "" {
		return nil, nil, fmt.Errorf("%w: a kept buffer needs a name", pool.ErrBadName)
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Name != "" && p.names[req.Name] != nil {
		return nil, nil, fmt.Errorf("%w: %q", pool.ErrNameTaken, req.Name)
	}
	if q, ok := p.cfg.Quota[s.cred.UID]; ok {
		if held := p.byUID[s.cred.UID]; held+device.RoundUp(req.Size, Align) > q {
			return nil, nil, fmt.Errorf("%w: uid %d holds %d of %d bytes, asks %d more", pool.ErrQuota, s.cred.UID, held, q, device.RoundUp(req.Size, Align))
		}
	}
	sl, off, err := p.place(req.Size)
	if err != nil {
		return nil, nil, err
	}
	a := &allocation{
		slab: sl, off: off, size: req.Size, taken: sl.arena.Round(req.Size),
		name: req.Name, bound: req.Name != "", kept: req.Keep,
		ownerUID: s.cred.UID, ownerPID: s.cred.PID,
	}
	p.allocs[a] = struct{}{}
	if a.bound {
		p.names[a.name] = a
	}
	p.used += a.taken
	p.byUID[a.ownerUID] += a.taken
	p.peak = max(p.peak, p.used)
	lease, fds, err := s.lease(a)
	if err != nil {
		a.kept = false
		p.release(a)
	}
	return lease, fds, err
}

func (s *session) open(name string) (any, []int, error) {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.names[name]
	if a == nil {
		return nil, nil, fmt.Errorf("%w: %q", pool.ErrNoSuchName, name)
	}
	return s.lease(a)
}

// lease gives the session a handle on a, with the slab's fd if the session
// has not been sent it. Called with p.mu held.
func (s *session) lease(a *allocation) (any, []int, error) {
	var fds []int
	if !s.sent[a.slab.id] {
		fd, err := unix.FcntlInt(uintptr(a.slab.s.FD()), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("gpupool: dup slab fd: %w", err)
		}
		fds = []int{fd}
		s.sent[a.slab.id] = true
	}
	s.nextHandle++
	s.leases[s.nextHandle] = a
	a.leases++
	return pool.Lease{
		Handle: s.nextHandle, Name: a.name, Slab: a.slab.id, SlabSize: a.slab.s.Size(),
		Kind: a.slab.s.Kind(), Offset: a.off, Size: a.size, FD: fds != nil,
	}, fds, nil
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
		delete(p.names, req.Name)
		a.bound = false
		a.kept = false
		p.release(a)
		return nil
	}
	a := s.leases[req.Handle]
	if a == nil {
		return fmt.Errorf("%w: handle %d", pool.ErrNoSuchLease, req.Handle)
	}
	delete(s.leases, req.Handle)
	a.leases--
	p.release(a)
	return nil
}

// Close implements ipc.Session: the connection's leases are dropped.
func (s *session) Close() {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for h, a := range s.leases {
		delete(s.leases, h)
		a.leases--
		p.release(a)
	}
	delete(p.sessions, s)
}

func (p *Pool) ls() pool.LsReply {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]pool.BufferInfo, 0, len(p.allocs))
	for a := range p.allocs {
		name := ""
		if a.bound {
			name = a.name
		}
		out = append(out, pool.BufferInfo{
			Name: name, Size: a.size, Slab: a.slab.id, Offset: a.off,
			Leases: a.leases, Kept: a.kept, OwnerUID: a.ownerUID, OwnerPID: a.ownerPID,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Name != "") != (b.Name != "") {
			return a.Name != ""
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Slab != b.Slab {
			return a.Slab < b.Slab
		}
		return a.Offset < b.Offset
	})
	return pool.LsReply{Buffers: out}
}
