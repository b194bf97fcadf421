package pool

import (
	"errors"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

// Ops of the pool protocol (libgpu/ipc/PROTOCOL.md, "Pool ops").
const (
	OpHello = "hello"
	OpAlloc = "alloc"
	OpOpen  = "open"
	OpSeal  = "seal"
	OpEvent = "event"
	OpFree  = "free"
	OpLs    = "ls"
	OpStats = "stats"
)

// Errors of the pool. They cross the socket with the codes registered in
// init, so errors.Is works on errors a Client returns.
var (
	ErrUnreachable = errors.New("pool: daemon unreachable")
	ErrClosed      = errors.New("pool: closed")
	ErrNoSuchName  = errors.New("pool: no such buffer name")
	ErrNameTaken   = errors.New("pool: buffer name already in use")
	ErrBadName     = errors.New("pool: bad buffer name")
	ErrNoSuchLease = errors.New("pool: no such lease")
	ErrNotOwner    = errors.New("pool: not the creator of the buffer")
	ErrBadSize     = errors.New("pool: bad size")
	ErrQuota       = errors.New("pool: quota exceeded")
	ErrNoMemory    = errors.New("pool: out of memory")
	ErrNotSealed   = errors.New("pool: buffer not sealed yet")
	ErrUnsupported = errors.New("pool: not supported by this daemon's backend")
	ErrNoEvent     = errors.New("pool: no event recorded for the buffer")
	ErrProtocol    = errors.New("pool: protocol error")
	// ErrPermission is ipc.ErrPermission: the daemon refused this peer, or
	// (with --isolate) a buffer of another uid.
	ErrPermission = ipc.ErrPermission
)

func init() {
	ipc.RegisterError("pool.unreachable", ErrUnreachable)
	ipc.RegisterError("pool.closed", ErrClosed)
	ipc.RegisterError("pool.no_such_name", ErrNoSuchName)
	ipc.RegisterError("pool.name_taken", ErrNameTaken)
	ipc.RegisterError("pool.bad_name", ErrBadName)
	ipc.RegisterError("pool.no_such_lease", ErrNoSuchLease)
	ipc.RegisterError("pool.not_owner", ErrNotOwner)
	ipc.RegisterError("pool.bad_size", ErrBadSize)
	ipc.RegisterError("pool.quota", ErrQuota)
	ipc.RegisterError("pool.no_memory", ErrNoMemory)
	ipc.RegisterError("pool.not_sealed", ErrNotSealed)
	ipc.RegisterError("pool.unsupported", ErrUnsupported)
	ipc.RegisterError("pool.no_event", ErrNoEvent)
	ipc.RegisterError("pool.protocol", ErrProtocol)
}

// MaxNameLen is the longest buffer name in bytes.
const MaxNameLen = 255

// MaxDims is the most dimensions a buffer's shape metadata may have.
const MaxDims = 16

// MaxDTypeLen is the longest dtype string in bytes.
const MaxDTypeLen = 32

// HelloRequest opens a session; Client names the program (for logs).
type HelloRequest struct {
	Client string `msgpack:"client,omitempty"`
}

// HelloReply describes the daemon.
type HelloReply struct {
	Server   string           `msgpack:"server"`    // the service: "gpupool"
	Protocol int              `msgpack:"protocol"`  // the protocol version it speaks (ipc.Version)
	PID      int              `msgpack:"pid"`       // daemon's process id
	Backend  string           `msgpack:"backend"`   // "host" (memfd) or "cuda"
	Share    device.ShareKind `msgpack:"share"`     // how slabs are shared
	SlabSize int64            `msgpack:"slab_size"` // bytes in a shared slab
	Align    int64            `msgpack:"align"`     // alignment of every offset, bytes
	UID      uint32           `msgpack:"uid"`       // the caller, as SO_PEERCRED saw it
	Device   int              `msgpack:"device"`    // CUDA device ordinal (cuda backend)
	Legacy   bool             `msgpack:"legacy"`    // the daemon can make legacy-IPC buffers
	// NoReply: the daemon honours requests that want no reply
	// (ipc.Message.NoReply), so a free can be one message (absent from
	// daemons that predate it).
	NoReply bool `msgpack:"noreply,omitempty"`
}

// AllocRequest asks for Size bytes.
//
// A non-empty Name makes the buffer openable by other clients. Keep (named
// only) makes the daemon hold a lease of its own, so the buffer outlives
// this connection until it is removed by name (a daemon run with
// --ephemeral ignores Keep). Unsealed creates the buffer in the "being
// written" state: open by other clients waits or fails with ErrNotSealed
// until a seal; otherwise it is sealed at once. Legacy asks for a cuMemAlloc
// buffer carrying a CUipcMemHandle (cuda backend only). DType and Shape are
// metadata shown by ls and returned by open; the daemon does not interpret
// them.
type AllocRequest struct {
	Name     string  `msgpack:"name,omitempty"`
	Size     int64   `msgpack:"size"`
	Keep     bool    `msgpack:"keep,omitempty"`
	Unsealed bool    `msgpack:"unsealed,omitempty"`
	Legacy   bool    `msgpack:"legacy,omitempty"`
	DType    string  `msgpack:"dtype,omitempty"`
	Shape    []int64 `msgpack:"shape,omitempty"`
}

// OpenRequest asks for a lease on the named buffer. WaitMS > 0 waits up to
// that many milliseconds for the buffer to be sealed (the daemon caps it);
// 0 fails at once with ErrNotSealed.
type OpenRequest struct {
	Name   string `msgpack:"name"`
	WaitMS int64  `msgpack:"wait_ms,omitempty"`
}

// SealRequest marks the buffer leased as Handle complete: opens waiting on
// it proceed.
type SealRequest struct {
	Handle uint64 `msgpack:"handle"`
}

// EventRequest sets (IPC non-empty, 64 bytes: a CUipcEventHandle) or reads
// the interprocess event of the buffer leased as Handle.
type EventRequest struct {
	Handle uint64 `msgpack:"handle"`
	IPC    []byte `msgpack:"ipc,omitempty"`
}

// EventReply carries the buffer's event handle (64 bytes), or none.
type EventReply struct {
	IPC []byte `msgpack:"ipc,omitempty"`
}

// Lease is the reply to alloc and open: where the buffer lives. When FD is
// true the slab's fd rides with the reply (the first time this connection
// sees the slab); otherwise the client has it already. A legacy-IPC buffer
// (Kind == device.ShareLegacyIPC) has no fd: Legacy is its 64-byte
// CUipcMemHandle and Offset is 0.
type Lease struct {
	Handle   uint64           `msgpack:"handle"` // per connection; free takes it
	Name     string           `msgpack:"name,omitempty"`
	Slab     uint64           `msgpack:"slab"` // slab id, never reused by a daemon
	SlabSize int64            `msgpack:"slab_size"`
	Kind     device.ShareKind `msgpack:"kind"`
	Offset   int64            `msgpack:"offset"` // bytes from the slab's start, Align-aligned
	Size     int64            `msgpack:"size"`   // bytes asked for
	FD       bool             `msgpack:"fd,omitempty"`
	Legacy   []byte           `msgpack:"legacy,omitempty"`
	Sealed   bool             `msgpack:"sealed,omitempty"`
	DType    string           `msgpack:"dtype,omitempty"`
	Shape    []int64          `msgpack:"shape,omitempty"`
	Event    []byte           `msgpack:"event,omitempty"` // CUipcEventHandle, when one is set
	// Dropped lists slabs this connection was sent that the daemon has
	// released since its last reply: the client unmaps them.
	Dropped []uint64 `msgpack:"dropped,omitempty"`
}

// FreeReply is the reply to free.
type FreeReply struct {
	Dropped []uint64 `msgpack:"dropped,omitempty"` // as in Lease
}

// FreeRequest drops the lease Handle, or, with Name, removes the name (rm):
// unbinds it and drops the daemon's own (Keep) lease; only the creator's uid
// (or root) may. Memory returns to the pool when no lease is left.
type FreeRequest struct {
	Handle uint64 `msgpack:"handle,omitempty"`
	Name   string `msgpack:"name,omitempty"`
}

// BufferInfo is one allocation as ls reports it.
type BufferInfo struct {
	Name     string  `msgpack:"name,omitempty" json:"name,omitempty"`
	Size     int64   `msgpack:"size" json:"size"`
	Slab     uint64  `msgpack:"slab" json:"slab"`
	Offset   int64   `msgpack:"offset" json:"offset"`
	Leases   int     `msgpack:"leases" json:"leases"` // connection leases
	Kept     bool    `msgpack:"kept,omitempty" json:"kept,omitempty"`
	Sealed   bool    `msgpack:"sealed,omitempty" json:"sealed,omitempty"`
	Legacy   bool    `msgpack:"legacy,omitempty" json:"legacy,omitempty"`
	DType    string  `msgpack:"dtype,omitempty" json:"dtype,omitempty"`
	Shape    []int64 `msgpack:"shape,omitempty" json:"shape,omitempty"`
	OwnerUID uint32  `msgpack:"owner_uid" json:"owner_uid"`
	OwnerPID int32   `msgpack:"owner_pid" json:"owner_pid"`
	AgeMS    int64   `msgpack:"age_ms" json:"age_ms"` // milliseconds since created
	// Orphan: kept and unsealed, and its creator's connection has ended:
	// nobody can seal it, and the daemon removes it after its grace period.
	Orphan bool `msgpack:"orphan,omitempty" json:"orphan,omitempty"`
}

// LsRequest asks for a page of the listing: the buffers after cursor
// After ("" for the first page; a reply's Next for the following ones),
// at most Limit of them (0: as many as fit a reply).
type LsRequest struct {
	After string `msgpack:"after,omitempty"`
	Limit int    `msgpack:"limit,omitempty"`
}

// LsReply lists allocations, named ones first, by name, then by slab and
// offset. A page ends where the reply would grow too large for a frame;
// Next, when not empty, is the cursor (LsRequest.After) of the next page.
type LsReply struct {
	Buffers []BufferInfo `msgpack:"buffers"`
	Next    string       `msgpack:"next,omitempty"`
}

// Stats are the daemon's counters. Bytes are aligned lengths.
type Stats struct {
	Backend     string `msgpack:"backend" json:"backend"`         // "host" or "cuda"
	Reserved    int64  `msgpack:"reserved" json:"reserved"`       // bytes in all slabs
	Used        int64  `msgpack:"used" json:"used"`               // bytes allocated
	Free        int64  `msgpack:"free" json:"free"`               // Reserved - Used
	Peak        int64  `msgpack:"peak" json:"peak"`               // highest Used seen
	Limit       int64  `msgpack:"limit" json:"limit"`             // most bytes Reserved may reach; 0: none
	Slabs       int    `msgpack:"slabs" json:"slabs"`             // slabs held (legacy buffers count as one each)
	Clients     int    `msgpack:"clients" json:"clients"`         // open connections
	Allocations int    `msgpack:"allocations" json:"allocations"` // live allocations
	Named       int    `msgpack:"named" json:"named"`             // bound names
	// Fragmentation of the free bytes of shared slabs: 1 - largest free
	// range / free bytes, over all shared slabs (0 when nothing is free or
	// all of it is one range). A common measure; see e.g. Johnstone and
	// Wilson, "The memory fragmentation problem: solved?" (ISMM 1998).
	Fragmentation float64 `msgpack:"fragmentation" json:"fragmentation"`
	// Waiting is the number of opens waiting for a buffer to be sealed.
	Waiting int `msgpack:"waiting" json:"waiting"`
	// Orphans is the number of kept, unsealed buffers whose creator's
	// connection has ended, awaiting removal (BufferInfo.Orphan).
	Orphans int `msgpack:"orphans" json:"orphans"`
	// FDLimit is the daemon's limit on open file descriptors
	// (RLIMIT_NOFILE, raised to the hard limit at start): every
	// connection and every slab holds one.
	FDLimit uint64 `msgpack:"fd_limit" json:"fd_limit"`
	// MaxConns is the most connections the daemon serves at once.
	MaxConns int `msgpack:"max_conns" json:"max_conns"`
}
