package server

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"gpukit/gpupool/internal/arena"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/trace"
)

// Names on the trace (libgpu/trace, when the daemon runs with --trace): a
// span of category traceCategory named by the op for every request, on a
// track per connection, and two counters of bytes.
const (
	traceCategory   = "pool"
	counterReserved = "pool.reserved" // bytes all slabs hold (Stats.Reserved)
	counterUsed     = "pool.used"     // bytes allocations take (Stats.Used)
)

// Align is the alignment of every allocation's offset and length in bytes.
const Align = 256

// MaxAlloc is the largest single allocation in bytes (1 TiB): a bound on
// what a bad request can ask of the kernel.
const MaxAlloc = 1 << 40

// DefaultSlabSize is the size of a shared slab (64 MiB).
const DefaultSlabSize = 64 << 20

// DefaultMaxWait caps how long an open waits for a buffer to be sealed.
const DefaultMaxWait = 5 * time.Minute

// DefaultOrphanGrace is how long a kept, unsealed buffer whose creator's
// connection ended stays before it is removed (Config.OrphanGrace).
const DefaultOrphanGrace = time.Minute

// Limits per connection (Config.ConnSlabs, ConnLeases, ConnMaps): each
// refusal is an error wrapping ipc.ErrLimit that names the limit. A
// connection also has at most one open waiting for a seal, as the daemon
// serves a connection's requests one at a time.
const (
	DefaultConnSlabs  = 1024  // slabs of their own (large or legacy buffers) a connection made and holds
	DefaultConnLeases = 65536 // leases a connection holds
	DefaultConnMaps   = 4096  // slabs whose fd a connection was sent (its file descriptors in flight or mapped)
)

// fdReserve is the part of the file descriptor limit kept for what is
// neither a connection nor a slab: the listener, stdio, fds being sent or
// received, the CUDA driver's, the tracer's.
const fdReserve = 256

// Config is what the daemon is told at start.
type Config struct {
	Source   SlabSource // nil: Memfd
	SlabSize int64      // shared slab size in bytes; 0: DefaultSlabSize
	// Limit bounds the bytes all slabs may reserve together; 0: no bound.
	// Empty shared slabs are released to make room before an allocation
	// fails with pool.ErrNoMemory.
	Limit int64
	// Quota bounds the bytes (aligned) that the buffers created by a uid
	// may hold at once; uids not in the map are unbounded.
	Quota map[uint32]int64
	// AllowUID and AllowGID, when either is non-nil, admit only peers
	// (SO_PEERCRED) whose uid is the daemon's own or in AllowUID, or whose
	// primary or supplementary group is in AllowGID (ipc.Admission);
	// others get ErrPermission and nothing else.
	AllowUID []uint32
	AllowGID []uint32
	// Idle, when positive, releases a shared slab that has stayed empty
	// this long; 0 keeps empty shared slabs for reuse (up to Limit).
	Idle time.Duration
	// LegacyAll makes every allocation a legacy-IPC buffer (the source
	// must be a LegacySource).
	LegacyAll bool
	// Ephemeral ties every named buffer to its creator's connection
	// (AllocRequest.Keep is ignored).
	Ephemeral bool
	// Isolate gives each uid slabs of its own and refuses to open one
	// uid's named buffer for another, so no client maps another uid's memory.
	Isolate bool
	// MaxWait caps OpenRequest.WaitMS; 0: DefaultMaxWait.
	MaxWait time.Duration
	// OrphanGrace: a kept buffer still unsealed when its creator's
	// connection ends (nobody can seal it any more) is removed this long
	// after (0: DefaultOrphanGrace; negative: at once).
	OrphanGrace time.Duration
	// MaxConns is the connection limit the daemon's ipc.Server is given
	// (the caller passes Config().MaxConns on; 0: ipc.DefaultMaxConns or a
	// quarter of the file descriptor limit, whichever is less), reported by
	// Stats and counted in MaxSlabs.
	MaxConns int
	// MaxSlabs bounds the slabs held at once, each one file descriptor
	// (0: the fd limit less MaxConns and a reserve of 256 or an eighth,
	// at least 16).
	MaxSlabs int
	// Per-connection limits; 0: the Default* constants.
	ConnSlabs, ConnLeases, ConnMaps int
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
	changed  chan struct{}    // closed (and replaced) when a name is sealed or unbound
	closed   bool
	self     uint32 // the daemon's uid, always admitted
	waiting  int    // opens waiting for a seal
	orphans  int    // allocations with orphan set
}

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

// New returns an empty pool.
func New(cfg Config) *Pool {
	if cfg.Source == nil {
		cfg.Source = Memfd{}
	}
	if cfg.SlabSize <= 0 {
		cfg.SlabSize = DefaultSlabSize
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.OrphanGrace == 0 {
		cfg.OrphanGrace = DefaultOrphanGrace
	}
	// The file descriptor budget: a reserve, a quarter for connections
	// (at most ipc.DefaultMaxConns by default), the rest for slabs.
	fds := int(min(ipc.FDLimit(), 1<<30))
	reserve := min(fdReserve, fds/8)
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = max(1, min(ipc.DefaultMaxConns, fds/4))
	}
	if cfg.MaxSlabs <= 0 {
		cfg.MaxSlabs = max(16, fds-cfg.MaxConns-reserve)
	}
	if cfg.ConnSlabs <= 0 {
		cfg.ConnSlabs = DefaultConnSlabs
	}
	if cfg.ConnLeases <= 0 {
		cfg.ConnLeases = DefaultConnLeases
	}
	if cfg.ConnMaps <= 0 {
		cfg.ConnMaps = DefaultConnMaps
	}
	cfg.SlabSize = device.RoundUp(cfg.SlabSize, cfg.Source.Granularity())
	return &Pool{
		cfg:      cfg,
		slabs:    map[uint64]*slab{},
		allocs:   map[*allocation]struct{}{},
		names:    map[string]*allocation{},
		sessions: map[*session]struct{}{},
		byUID:    map[uint32]int64{},
		changed:  make(chan struct{}),
		self:     uint32(os.Geteuid()),
	}
}

// Config returns the configuration the pool runs with (defaults filled in).
func (p *Pool) Config() Config { return p.cfg }

func (p *Pool) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}

// notify wakes opens waiting for a seal. Called with p.mu held.
func (p *Pool) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// admission is who may connect: anyone when no AllowUID/AllowGID is set,
// else the daemon's own uid and those listed.
func (p *Pool) admission() ipc.Admission {
	return ipc.Admission{Anyone: p.cfg.AllowUID == nil && p.cfg.AllowGID == nil, Self: p.self, UIDs: p.cfg.AllowUID, GIDs: p.cfg.AllowGID}
}

// Connect implements ipc.Handler.
func (p *Pool) Connect(c *ipc.Conn) (ipc.Session, error) {
	cred, err := c.PeerCred()
	if err != nil {
		return nil, err
	}
	if err := p.admission().Check(cred); err != nil {
		p.logf("gpupool: refused uid %d gid %d (pid %d)", cred.UID, cred.GID, cred.PID)
		return nil, ipc.ErrPermission
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, pool.ErrClosed
	}
	s := &session{p: p, cred: cred, leases: map[uint64]*allocation{}, sent: map[uint64]bool{}, events: map[*allocation]struct{}{}, unsealed: map[*allocation]struct{}{}, own: map[*slab]struct{}{}}
	if t := trace.Default(); t != nil {
		s.trk = t.Track(fmt.Sprintf("conn pid %d", cred.PID))
	}
	p.sessions[s] = struct{}{}
	return s, nil
}

// Stats returns the pool's counters.
func (p *Pool) Stats() pool.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var free, stray int64
	for _, s := range p.slabs {
		if s.dedicated {
			continue
		}
		f := s.arena.Size() - s.arena.Used()
		free += f
		stray += f - s.arena.Largest()
	}
	frag := 0.0
	if free > 0 {
		frag = float64(stray) / float64(free)
	}
	return pool.Stats{
		Backend:  p.cfg.Source.Backend(),
		Reserved: p.reserved, Used: p.used, Free: p.reserved - p.used, Peak: p.peak, Limit: p.cfg.Limit,
		Slabs: len(p.slabs), Clients: len(p.sessions), Allocations: len(p.allocs), Named: len(p.names),
		Fragmentation: frag, Waiting: p.waiting, Orphans: p.orphans,
		FDLimit: ipc.FDLimit(), MaxConns: p.cfg.MaxConns,
	}
}

// Close releases every slab. Call it after the ipc.Server has shut down.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		p.notify()
	}
	for a := range p.allocs {
		if a.reap != nil {
			a.reap.Stop()
		}
	}
	var first error
	for id, s := range p.slabs {
		if s.idle != nil {
			s.idle.Stop()
		}
		if err := s.s.Close(); err != nil && first == nil {
			first = err
		}
		delete(p.slabs, id)
	}
	p.reserved = 0
	p.traceBytes()
	return first
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

// orphan marks a (kept, unsealed, its creator gone) for removal after the
// grace period, or removes it now. Called with p.mu held.
func (p *Pool) orphan(a *allocation) {
	a.orphan = true
	a.creator = nil
	p.orphans++
	if p.cfg.OrphanGrace < 0 {
		p.removeOrphan(a)
		return
	}
	p.logf("gpupool: %q: its creator (pid %d) ended before sealing it; removing it in %v", a.name, a.ownerPID, p.cfg.OrphanGrace)
	a.reap = time.AfterFunc(p.cfg.OrphanGrace, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if a.orphan && !p.closed {
			p.removeOrphan(a)
		}
	})
}

// unorphan takes a off the orphans (it is being removed another way).
// Called with p.mu held.
func (p *Pool) unorphan(a *allocation) {
	if !a.orphan {
		return
	}
	a.orphan = false
	p.orphans--
	if a.reap != nil {
		a.reap.Stop()
		a.reap = nil
	}
}

// removeOrphan removes an orphan as rm would: its name is unbound (opens
// waiting on it get pool.ErrNoSuchName) and its memory returns. Called
// with p.mu held.
func (p *Pool) removeOrphan(a *allocation) {
	p.unorphan(a)
	p.logf("gpupool: %q: removed (left unsealed by its creator, pid %d)", a.name, a.ownerPID)
	if a.bound && p.names[a.name] == a {
		delete(p.names, a.name)
		p.notify()
	}
	a.bound = false
	a.kept = false
	p.release(a)
}

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
