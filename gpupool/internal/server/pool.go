package server

import (
	"fmt"
	"os"
	"sync"
	"time"

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

func (p *Pool) shareKind() device.ShareKind {
	if p.cfg.Source.Backend() == "cuda" {
		return device.ShareVMM
	}
	return device.ShareMemfd
}
