package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

// Client is a connection to gpupool. It is safe for concurrent use by
// several goroutines. Buffers it returns are views into slabs it has mapped;
// they are valid until freed or until Close, which unmaps every slab.
type Client struct {
	path  string
	rpc   *ipc.Client
	dev   device.Device
	hello HelloReply

	mu     sync.Mutex
	slabs  map[uint64]*slabMap
	closed bool
}

// slabMap is one slab mapped into this process; ready is closed once mem
// (or err) is set.
type slabMap struct {
	ready chan struct{}
	fd    int
	size  int64
	kind  device.ShareKind
	mem   []byte
	err   error
}

// Dial connects to the daemon at path and says hello. An absent or dead
// socket gives an error wrapping ErrUnreachable that names the path and how
// to start a daemon; a refused peer gets ErrPermission.
func Dial(path string) (*Client, error) {
	conn, err := ipc.Dial(path)
	if err != nil {
		var why error = err
		var se *os.SyscallError
		if errors.As(err, &se) {
			why = se.Err
		}
		return nil, fmt.Errorf("%w at %s: %v (start one with: gpupool serve --socket %s)", ErrUnreachable, path, why, path)
	}
	c := &Client{path: path, rpc: ipc.NewClient(conn), dev: device.NewHost(), slabs: map[uint64]*slabMap{}}
	if _, err := c.rpc.Call(context.Background(), OpHello, HelloRequest{Client: filepath.Base(os.Args[0])}, &c.hello); err != nil {
		c.rpc.Close()
		if errors.Is(err, ipc.ErrClosed) {
			return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, path, err)
		}
		return nil, fmt.Errorf("pool: hello to %s: %w", path, err)
	}
	if c.hello.Server != "gpupool" {
		c.rpc.Close()
		return nil, fmt.Errorf("%w: %s answers as %q, not gpupool", ErrProtocol, path, c.hello.Server)
	}
	if c.hello.Share != device.ShareMemfd {
		c.rpc.Close()
		return nil, fmt.Errorf("%w: daemon at %s shares %s slabs; this client maps memfd slabs only", ErrProtocol, path, c.hello.Share)
	}
	return c, nil
}

// Path is the socket this client dialed.
func (c *Client) Path() string { return c.path }

// Hello is what the daemon said about itself when the client connected.
func (c *Client) Hello() HelloReply { return c.hello }

// Device is where the client's buffers live: host memory for a memfd pool.
func (c *Client) Device() device.Device { return c.dev }

// Alloc implements device.Allocator: a new buffer of size bytes (contents
// undefined), leased by this connection. A non-empty name makes it openable
// by other clients while it lives (ErrNameTaken if the name is bound).
func (c *Client) Alloc(name string, size int64) (*device.Buffer, error) {
	return c.alloc(AllocRequest{Name: name, Size: size})
}

// AllocKeep allocates a named buffer that the daemon keeps after this
// connection ends, until FreeName(name) and the last lease are gone.
func (c *Client) AllocKeep(name string, size int64) (*device.Buffer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: a kept buffer needs a name", ErrBadName)
	}
	return c.alloc(AllocRequest{Name: name, Size: size, Keep: true})
}

func (c *Client) alloc(req AllocRequest) (*device.Buffer, error) {
	if req.Size <= 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadSize, req.Size)
	}
	return c.lease(OpAlloc, req)
}

// Open returns a new lease on the named buffer: the same memory its creator
// and other openers see. ErrNoSuchName if no buffer has that name.
func (c *Client) Open(name string) (*device.Buffer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty name", ErrBadName)
	}
	return c.lease(OpOpen, OpenRequest{Name: name})
}

func (c *Client) lease(op string, req any) (*device.Buffer, error) {
	var l Lease
	fds, err := c.rpc.Call(context.Background(), op, req, &l)
	if err != nil {
		return nil, c.wrap(op, err)
	}
	s, err := c.slab(l, fds)
	if err != nil {
		c.freeHandle(l.Handle)
		return nil, err
	}
	if l.Offset < 0 || l.Size <= 0 || l.Offset+l.Size > s.size {
		c.freeHandle(l.Handle)
		return nil, fmt.Errorf("%w: lease [%d,+%d) outside slab %d of %d bytes", ErrProtocol, l.Offset, l.Size, l.Slab, s.size)
	}
	mem := s.mem[l.Offset : l.Offset+l.Size : l.Offset+l.Size]
	share := device.Shareable{Kind: s.kind, FD: s.fd, SlabSize: s.size, Offset: l.Offset, Size: l.Size}
	handle := l.Handle
	return device.NewBuffer(c.dev, uintptr(unsafe.Pointer(&mem[0])), l.Size, mem, share, func() error {
		return c.freeHandle(handle)
	}), nil
}

// slab returns the mapping of the lease's slab, mapping it from the fd that
// came with the reply the first time. A reply without an fd for a slab whose
// fd is still on its way in another goroutine's reply waits for that one.
func (c *Client) slab(l Lease, fds []int) (*slabMap, error) {
	if len(fds) > 1 || (len(fds) == 1) != l.FD {
		ipc.CloseFDs(fds)
		return nil, fmt.Errorf("%w: reply says fd=%v and carries %d fds", ErrProtocol, l.FD, len(fds))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		ipc.CloseFDs(fds)
		return nil, ErrClosed
	}
	s, ok := c.slabs[l.Slab]
	if !ok {
		s = &slabMap{ready: make(chan struct{}), fd: -1}
		c.slabs[l.Slab] = s
	}
	c.mu.Unlock()
	if l.FD {
		select {
		case <-s.ready:
			unix.Close(fds[0])
			return nil, fmt.Errorf("%w: slab %d sent twice", ErrProtocol, l.Slab)
		default:
		}
		s.fd, s.size, s.kind = fds[0], l.SlabSize, l.Kind
		if l.SlabSize <= 0 {
			s.err = fmt.Errorf("%w: slab %d of %d bytes", ErrProtocol, l.Slab, l.SlabSize)
		} else if s.mem, s.err = device.MapFD(fds[0], l.SlabSize); s.err != nil {
			s.err = fmt.Errorf("pool: map slab %d: %w", l.Slab, s.err)
		}
		close(s.ready)
	} else {
		select {
		case <-s.ready:
		case <-c.rpc.Done():
			select {
			case <-s.ready:
			default:
				return nil, fmt.Errorf("%w: connection ended before slab %d arrived", ErrClosed, l.Slab)
			}
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

func (c *Client) freeHandle(h uint64) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// The daemon dropped every lease of this connection already.
		return nil
	}
	_, err := c.rpc.Call(context.Background(), OpFree, FreeRequest{Handle: h}, nil)
	return c.wrap(OpFree, err)
}

// Free frees b (a buffer this client returned); the same as b.Free().
func (c *Client) Free(b *device.Buffer) error { return b.Free() }

// FreeName unbinds name and drops the daemon's own lease on it (see
// AllocKeep). Clients that hold leases keep their memory until they free
// it. Only the creator's uid (or root) may do this (ErrNotOwner).
func (c *Client) FreeName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrBadName)
	}
	_, err := c.rpc.Call(context.Background(), OpFree, FreeRequest{Name: name}, nil)
	return c.wrap(OpFree, err)
}

// Ls lists the daemon's allocations.
func (c *Client) Ls() ([]BufferInfo, error) {
	var r LsReply
	_, err := c.rpc.Call(context.Background(), OpLs, nil, &r)
	return r.Buffers, c.wrap(OpLs, err)
}

// Stats returns the daemon's counters.
func (c *Client) Stats() (Stats, error) {
	var s Stats
	_, err := c.rpc.Call(context.Background(), OpStats, nil, &s)
	return s, c.wrap(OpStats, err)
}

func (c *Client) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ipc.ErrClosed) && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %s: %w", ErrClosed, op, err)
	}
	return err
}

// Close ends the connection (the daemon releases every lease it held) and
// unmaps the slabs. Buffers of this client must not be used afterwards.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	err := c.rpc.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slabs {
		select {
		case <-s.ready:
			if s.mem != nil {
				unix.Munmap(s.mem)
			}
			if s.fd >= 0 {
				unix.Close(s.fd)
			}
		default:
		}
	}
	c.slabs = nil
	return err
}

var _ device.Allocator = (*Client)(nil)
