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
	ErrProtocol    = errors.New("pool: protocol error")
	// ErrPermission is ipc.ErrPermission: the daemon refused this peer.
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
	ipc.RegisterError("pool.protocol", ErrProtocol)
}

// MaxNameLen is the longest buffer name in bytes.
const MaxNameLen = 255

// HelloRequest opens a session; Client names the program (for logs).
type HelloRequest struct {
	Client string `msgpack:"client,omitempty"`
}

// HelloReply describes the daemon.
type HelloReply struct {
	Server   string           `msgpack:"server"`    // "gpupool"
	PID      int              `msgpack:"pid"`       // daemon's process id
	Backend  string           `msgpack:"backend"`   // "host" (memfd) or "cuda"
	Share    device.ShareKind `msgpack:"share"`     // how slabs are shared
	SlabSize int64            `msgpack:"slab_size"` // bytes in a shared slab
	Align    int64            `msgpack:"align"`     // alignment of every offset, bytes
	UID      uint32           `msgpack:"uid"`       // the caller, as SO_PEERCRED saw it
}

// AllocRequest asks for Size bytes. A non-empty Name makes the buffer
// openable by other clients; Keep (named buffers only) makes the daemon hold
// a lease of its own, so the buffer outlives this connection until it is
// freed by name.
type AllocRequest struct {
	Name string `msgpack:"name,omitempty"`
	Size int64  `msgpack:"size"`
	Keep bool   `msgpack:"keep,omitempty"`
}

// OpenRequest asks for a lease on the named buffer.
type OpenRequest struct {
	Name string `msgpack:"name"`
}

// Lease is the reply to alloc and open: where the buffer lives. When FD is
// true the slab's fd rides with the reply (the first time this connection
// sees the slab); otherwise the client has it already.
type Lease struct {
	Handle   uint64           `msgpack:"handle"` // per connection; free takes it
	Name     string           `msgpack:"name,omitempty"`
	Slab     uint64           `msgpack:"slab"` // slab id, never reused by a daemon
	SlabSize int64            `msgpack:"slab_size"`
	Kind     device.ShareKind `msgpack:"kind"`
	Offset   int64            `msgpack:"offset"` // bytes from the slab's start, Align-aligned
	Size     int64            `msgpack:"size"`   // bytes asked for
	FD       bool             `msgpack:"fd,omitempty"`
}

// FreeRequest drops the lease Handle, or, with Name, unbinds the name and
// drops the daemon's own (Keep) lease; only the creator's uid (or root) may
// free by name. Memory returns to the pool when no lease is left.
type FreeRequest struct {
	Handle uint64 `msgpack:"handle,omitempty"`
	Name   string `msgpack:"name,omitempty"`
}

// BufferInfo is one allocation as ls reports it.
type BufferInfo struct {
	Name     string `msgpack:"name,omitempty"`
	Size     int64  `msgpack:"size"`
	Slab     uint64 `msgpack:"slab"`
	Offset   int64  `msgpack:"offset"`
	Leases   int    `msgpack:"leases"` // connection leases
	Kept     bool   `msgpack:"kept,omitempty"`
	OwnerUID uint32 `msgpack:"owner_uid"`
	OwnerPID int32  `msgpack:"owner_pid"`
}

// LsReply lists allocations, named ones first, by name, then by slab and offset.
type LsReply struct {
	Buffers []BufferInfo `msgpack:"buffers"`
}

// Stats are the daemon's counters. Bytes are aligned lengths.
type Stats struct {
	Reserved    int64 `msgpack:"reserved" json:"reserved"`       // bytes in all slabs
	Used        int64 `msgpack:"used" json:"used"`               // bytes allocated
	Free        int64 `msgpack:"free" json:"free"`               // Reserved - Used
	Peak        int64 `msgpack:"peak" json:"peak"`               // highest Used seen
	Slabs       int   `msgpack:"slabs" json:"slabs"`             // slabs held
	Clients     int   `msgpack:"clients" json:"clients"`         // open connections
	Allocations int   `msgpack:"allocations" json:"allocations"` // live allocations
	Named       int   `msgpack:"named" json:"named"`             // bound names
}
