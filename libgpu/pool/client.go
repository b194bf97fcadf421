package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ipc"
)

// Client is a connection to gpupool. It is safe for concurrent use by
// several goroutines. Buffers it returns are views into slabs it has mapped;
// they are valid until freed or until Close, which unmaps every slab.
//
// If the daemon dies, the client's next call fails with an error wrapping
// ErrClosed that says so; memory the client has mapped stays valid until
// Close (or Free) unmaps it.
type Client struct {
	path   string
	conn   *ipc.Conn
	trust  []uint32 // uids trusted to run the daemon besides this one's and root
	rpc    *ipc.Client
	dev    device.Device
	cdev   *device.CUDA // nil for a host pool
	ownDev bool
	hello  HelloReply
	// timeout is the requests' deadline (Options.Timeout).
	timeout time.Duration

	mu     sync.Mutex
	slabs  map[uint64]*slabMap
	events map[[64]byte]*exec.IPCEvent // events of other processes, opened here
	closed bool
}

// slabMap is one slab mapped into this process; ready is closed once the
// mapping (or err) is set.
type slabMap struct {
	ready chan struct{}
	fd    int
	size  int64
	kind  device.ShareKind
	mem   []byte         // memfd slabs: the host mapping
	imp   *device.Buffer // VMM and legacy slabs: the device mapping
	base  uintptr        // address of byte 0 (host or device)
	err   error
}

// Options change how Dial connects.
type Options struct {
	// Device is the GPU to map a cuda pool's slabs on. nil: the client
	// opens the daemon's device (device.NewCUDA(hello.Device)) and closes
	// it in Close. Pass the device your code already uses so the pool's
	// buffers belong to it (device.CUDA methods check that).
	Device *device.CUDA
	// Timeout bounds every request's wait for its reply (0:
	// ipc.DefaultTimeout, 30 s). A daemon that does not answer in time
	// (a hung one, or a socket that is not gpupool's) ends the connection
	// with an error wrapping ipc.ErrTimeout. OpenWait's wait is added to it.
	Timeout time.Duration
	// TrustUIDs are uids, besides this process's own and root's, that may
	// run the daemon (nil: those in $GPUKIT_POOL_UID, comma-separated).
	// The listener's uid is checked before anything is sent.
	TrustUIDs []uint32
}

// EnvTrustUIDs names the environment variable with the uids a client
// trusts to run the daemon, besides its own and root (comma-separated).
const EnvTrustUIDs = "GPUKIT_POOL_UID"

// Dial connects to the daemon at path and says hello. An absent or dead
// socket gives an error wrapping ErrUnreachable that names the path and how
// to start a daemon; a refused peer gets ErrPermission; a daemon run by a
// uid this process does not trust gets ipc.ErrUntrusted (nothing is sent
// to it). When the daemon shares CUDA memory the client opens the GPU it
// names.
func Dial(path string) (*Client, error) { return DialOptions(path, Options{}) }

// trustUIDs reads EnvTrustUIDs.
func trustUIDs() ([]uint32, error) {
	var out []uint32
	for _, f := range strings.FieldsFunc(os.Getenv(EnvTrustUIDs), func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("pool: $%s: %q is not a uid", EnvTrustUIDs, f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// DialOptions is Dial with options.
func DialOptions(path string, o Options) (*Client, error) {
	trust := o.TrustUIDs
	if trust == nil {
		var err error
		if trust, err = trustUIDs(); err != nil {
			return nil, err
		}
	}
	conn, err := ipc.DialWith(path, ipc.DialOptions{TrustUIDs: trust})
	if err != nil {
		if errors.Is(err, ipc.ErrUntrusted) {
			return nil, fmt.Errorf("pool: %w (to use it anyway: %s=UID)", err, EnvTrustUIDs)
		}
		var why error = err
		var se *os.SyscallError
		if errors.As(err, &se) {
			why = se.Err
		}
		return nil, fmt.Errorf("%w at %s: %v (start one with: gpupool serve --socket %s)", ErrUnreachable, path, why, path)
	}
	o.TrustUIDs = trust
	return newClient(conn, path, o)
}

// newClient says hello on conn and makes the client; it takes conn.
func newClient(conn *ipc.Conn, path string, o Options) (*Client, error) {
	c := &Client{path: path, conn: conn, trust: o.TrustUIDs, rpc: ipc.NewClient(conn), slabs: map[uint64]*slabMap{}, events: map[[64]byte]*exec.IPCEvent{}}
	c.timeout = o.Timeout
	if c.timeout <= 0 {
		c.timeout = ipc.DefaultTimeout
	}
	c.rpc.SetTimeout(c.timeout)
	if _, err := c.rpc.Call(context.Background(), OpHello, HelloRequest{Client: filepath.Base(os.Args[0])}, &c.hello); err != nil {
		c.rpc.Close()
		var re *ipc.RemoteError
		switch {
		case errors.As(err, &re):
			// The daemon's answer (a refusal says why before it closes).
			return nil, fmt.Errorf("pool: hello to %s: %w", path, re)
		case errors.Is(err, ipc.ErrMalformed) || errors.Is(err, ipc.ErrTimeout):
			return nil, fmt.Errorf("%w: %s is not a gpupool socket: %w", ErrProtocol, path, err)
		case errors.Is(err, ipc.ErrClosed):
			return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, path, err)
		}
		return nil, fmt.Errorf("pool: hello to %s: %w", path, err)
	}
	if c.hello.Server != "gpupool" {
		c.rpc.Close()
		return nil, fmt.Errorf("%w: %s answers as %q, not gpupool", ErrProtocol, path, c.hello.Server)
	}
	if c.hello.Protocol != 0 && c.hello.Protocol != ipc.Version {
		c.rpc.Close()
		return nil, fmt.Errorf("%w: gpupool at %s speaks protocol %d, this client %d", ErrProtocol, path, c.hello.Protocol, ipc.Version)
	}
	switch c.hello.Share {
	case device.ShareMemfd:
		c.dev = device.NewHost()
	case device.ShareVMM:
		if o.Device != nil {
			c.cdev = o.Device
		} else {
			d, err := device.NewCUDA(c.hello.Device)
			if err != nil {
				c.rpc.Close()
				return nil, fmt.Errorf("pool: the daemon at %s shares CUDA memory of device %d: %w", path, c.hello.Device, err)
			}
			c.cdev, c.ownDev = d, true
		}
		c.dev = c.cdev
	default:
		c.rpc.Close()
		return nil, fmt.Errorf("%w: daemon at %s shares %s slabs, which this client cannot map", ErrProtocol, path, c.hello.Share)
	}
	return c, nil
}

// Handover makes a new connection to the daemon c is connected to, checked
// as Dial checks, and returns its socket unused, for another process to
// act on the pool as this one: the optimizer service is handed one with
// register, so it opens the client's buffers and allocates the run's state
// with the client's uid (its rights under --isolate, its quota). The
// caller closes the file once it is sent.
func (c *Client) Handover() (*os.File, error) {
	conn, err := ipc.DialWith(c.path, ipc.DialOptions{TrustUIDs: c.trust})
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, c.path, err)
	}
	defer conn.Close()
	return conn.File()
}

// Adopt makes a client of fd, a connection to a pool that another process
// made and handed over (Handover), and takes fd. It checks, before
// anything is sent, that fd reaches the daemon c reaches (the same
// listener pid, uid and socket address: ipc.Conn.Listener), says hello,
// and checks that the daemon sees uid at the other end (the connection is
// that uid's: whatever the new client does, the daemon checks as that
// uid's). o.Device defaults to c's device.
func (c *Client) Adopt(fd int, uid uint32, o Options) (*Client, error) {
	conn, err := ipc.FileConn(fd)
	if err != nil {
		return nil, fmt.Errorf("%w: the connection handed over: %v", ErrProtocol, err)
	}
	if err := c.sameDaemon(conn); err != nil {
		conn.Close()
		return nil, err
	}
	if o.Device == nil {
		o.Device = c.cdev
	}
	if o.Timeout <= 0 {
		o.Timeout = c.timeout
	}
	o.TrustUIDs = c.trust
	nc, err := newClient(conn, c.path, o)
	if err != nil {
		return nil, err
	}
	if nc.hello.UID != uid {
		nc.Close()
		return nil, fmt.Errorf("%w: the pool connection handed over is uid %d's, not uid %d's", ipc.ErrPermission, nc.hello.UID, uid)
	}
	return nc, nil
}

// sameDaemon checks that conn reaches the daemon at c.path: the listener
// c's own connection reaches, or (the daemon was restarted since) the one
// a new connection to c.path reaches now.
func (c *Client) sameDaemon(conn *ipc.Conn) error {
	cred, addr, err := conn.Listener()
	if err != nil {
		return fmt.Errorf("%w: the connection handed over: %v", ErrProtocol, err)
	}
	want, wantAddr, err := c.conn.Listener()
	if err == nil && cred == want && addr == wantAddr {
		return nil
	}
	probe, err := ipc.DialWith(c.path, ipc.DialOptions{TrustUIDs: c.trust})
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, c.path, err)
	}
	defer probe.Close()
	if want, wantAddr, err = probe.Listener(); err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, c.path, err)
	}
	if cred != want || addr != wantAddr {
		return fmt.Errorf("%w: the connection handed over reaches %q (pid %d, uid %d), not the pool at %s", ipc.ErrPermission, addr, cred.PID, cred.UID, c.path)
	}
	return nil
}

// Path is the socket this client dialed.
func (c *Client) Path() string { return c.path }

// Hello is what the daemon said about itself when the client connected.
func (c *Client) Hello() HelloReply { return c.hello }

// Device is where the client's buffers live: host memory for a memfd pool,
// the GPU (a *device.CUDA) for a cuda pool.
func (c *Client) Device() device.Device { return c.dev }

// Alloc implements device.Allocator: a new buffer of size bytes (contents
// undefined), leased by this connection. A non-empty name makes it openable
// by other clients while it lives (ErrNameTaken if the name is bound); it
// is sealed at once and goes with this connection (see Create for named
// buffers that outlive it).
func (c *Client) Alloc(name string, size int64) (*device.Buffer, error) {
	b, err := c.AllocRequest(AllocRequest{Name: name, Size: size})
	if err != nil {
		return nil, err
	}
	return b.Buffer, nil
}

// AllocKeep allocates a named buffer that the daemon keeps after this
// connection ends, until it is removed by name (Remove) and the last lease
// is gone.
func (c *Client) AllocKeep(name string, size int64) (*device.Buffer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: a kept buffer needs a name", ErrBadName)
	}
	b, err := c.AllocRequest(AllocRequest{Name: name, Size: size, Keep: true})
	if err != nil {
		return nil, err
	}
	return b.Buffer, nil
}

// CreateOptions describe a named buffer made by Create.
type CreateOptions struct {
	DType string  // metadata, e.g. "f32" (tensor.DType's names)
	Shape []int64 // metadata
	// Legacy makes a cuMemAlloc buffer with a CUipcMemHandle that CuPy and
	// PyTorch can open (cuda pools only; ErrUnsupported otherwise).
	Legacy bool
	// Ephemeral ties the buffer to this connection: it goes when the
	// connection ends. By default the daemon keeps it until Remove.
	Ephemeral bool
	// Sealed creates it sealed: openers need not wait for Seal.
	Sealed bool
}

// Create makes a named buffer in the create → write → seal life cycle: it is
// unsealed, so Open by other clients waits (or fails with ErrNotSealed)
// until b.Seal(); write it, then seal it. Unless o.Ephemeral, it outlives
// this connection until Remove(name).
func (c *Client) Create(name string, size int64, o CreateOptions) (*Buffer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: Create needs a name", ErrBadName)
	}
	return c.AllocRequest(AllocRequest{
		Name: name, Size: size, Keep: !o.Ephemeral, Unsealed: !o.Sealed,
		Legacy: o.Legacy, DType: o.DType, Shape: o.Shape,
	})
}

// AllocRequest sends an alloc with every field of req.
func (c *Client) AllocRequest(req AllocRequest) (*Buffer, error) {
	if req.Size <= 0 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadSize, req.Size)
	}
	return c.lease(context.Background(), OpAlloc, req)
}

// Open returns a new lease on the named, sealed buffer: the same memory its
// creator and other openers see. ErrNoSuchName if no buffer has that name,
// ErrNotSealed if it is still being written (see OpenWait).
func (c *Client) Open(name string) (*device.Buffer, error) {
	b, err := c.OpenWait(name, 0)
	if err != nil {
		return nil, err
	}
	return b.Buffer, nil
}

// OpenWait is Open that waits up to timeout for the buffer to be sealed
// (the daemon caps the wait, 5 minutes by default). The daemon serves this
// connection's other requests after the wait.
func (c *Client) OpenWait(name string, timeout time.Duration) (*Buffer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty name", ErrBadName)
	}
	ms := timeout.Milliseconds()
	if timeout > 0 && ms == 0 {
		ms = 1
	}
	if ms <= 0 {
		return c.lease(context.Background(), OpOpen, OpenRequest{Name: name})
	}
	// The daemon waits at most ms (less if it caps the wait); the reply
	// may take the usual time on top.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond+c.timeout)
	defer cancel()
	return c.lease(ctx, OpOpen, OpenRequest{Name: name, WaitMS: ms})
}

func (c *Client) lease(ctx context.Context, op string, req any) (*Buffer, error) {
	var l Lease
	fds, err := c.rpc.Call(ctx, op, req, &l)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// The reply may still come, with a slab's fd the daemon
			// would think delivered: the connection cannot go on.
			c.rpc.Close()
			err = fmt.Errorf("%w: %w: no reply to %s in time", ipc.ErrClosed, ipc.ErrTimeout, op)
		}
		return nil, c.wrap(op, err)
	}
	c.unmap(l.Dropped)
	s, err := c.slab(l, fds)
	if err != nil {
		c.freeHandle(l.Handle, false)
		return nil, err
	}
	if l.Offset < 0 || l.Size <= 0 || l.Offset+l.Size > s.size {
		c.freeHandle(l.Handle, false)
		return nil, fmt.Errorf("%w: lease [%d,+%d) outside slab %d of %d bytes", ErrProtocol, l.Offset, l.Size, l.Slab, s.size)
	}
	share := device.Shareable{Kind: s.kind, FD: s.fd, SlabSize: s.size, Offset: l.Offset, Size: l.Size}
	if s.kind == device.ShareLegacyIPC {
		copy(share.Legacy[:], l.Legacy)
	}
	var host []byte
	if s.mem != nil {
		host = s.mem[l.Offset : l.Offset+l.Size : l.Offset+l.Size]
	}
	b := &Buffer{c: c, lease: l}
	b.Buffer = device.NewBuffer(c.dev, s.base+uintptr(l.Offset), l.Size, host, share, b.release)
	return b, nil
}

// slab returns the mapping of the lease's slab, mapping it from the fd that
// came with the reply (or the legacy handle in it) the first time. A reply
// without an fd for a slab whose fd is still on its way in another
// goroutine's reply waits for that one.
func (c *Client) slab(l Lease, fds []int) (*slabMap, error) {
	legacy := l.Kind == device.ShareLegacyIPC
	if len(fds) > 1 || (len(fds) == 1) != l.FD || (legacy && l.FD) {
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
	if l.FD || (legacy && !ok) {
		select {
		case <-s.ready:
			ipc.CloseFDs(fds)
			return nil, fmt.Errorf("%w: slab %d sent twice", ErrProtocol, l.Slab)
		default:
		}
		s.size, s.kind = l.SlabSize, l.Kind
		if len(fds) == 1 {
			s.fd = fds[0]
		}
		if l.SlabSize <= 0 {
			s.err = fmt.Errorf("%w: slab %d of %d bytes", ErrProtocol, l.Slab, l.SlabSize)
		} else if s.err = c.mapSlab(s, l); s.err != nil {
			s.err = fmt.Errorf("pool: map slab %d: %w", l.Slab, s.err)
		}
		close(s.ready)
	} else {
		select {
		case <-s.ready:
		default:
			// The fd is on its way in another goroutine's reply.
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
	}
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

// mapSlab maps a slab that just arrived: mmap for memfd, import and map for
// VMM (cuMemImportFromShareableHandle, cuMemMap), cuIpcOpenMemHandle for
// legacy buffers.
func (c *Client) mapSlab(s *slabMap, l Lease) error {
	switch l.Kind {
	case device.ShareMemfd:
		if c.cdev != nil {
			return fmt.Errorf("%w: a memfd slab from a cuda daemon", ErrProtocol)
		}
		// A slab another client could shrink would kill this one with
		// SIGBUS: the daemon seals them (PROTOCOL.md, "Slabs").
		const want = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if seals, err := unix.FcntlInt(uintptr(s.fd), unix.F_GET_SEALS, 0); err != nil || seals&want != want {
			return fmt.Errorf("%w: memfd slab %d is not sealed against resizing (seals %#x, %v)", ErrProtocol, l.Slab, seals, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(s.fd, &st); err == nil && st.Size != l.SlabSize {
			return fmt.Errorf("%w: memfd slab %d holds %d bytes, the lease says %d", ErrProtocol, l.Slab, st.Size, l.SlabSize)
		}
		mem, err := device.MapFD(s.fd, l.SlabSize)
		if err != nil {
			return err
		}
		s.mem, s.base = mem, uintptr(unsafe.Pointer(&mem[0])) // mmap'd, not Go memory
		return nil
	case device.ShareVMM:
		if c.cdev == nil {
			return fmt.Errorf("%w: a VMM slab for a host client", ErrProtocol)
		}
		b, err := c.cdev.ImportVMM(device.Shareable{Kind: device.ShareVMM, FD: s.fd, SlabSize: l.SlabSize, Size: l.SlabSize})
		if err != nil {
			return err
		}
		s.imp, s.base = b, b.Ptr()
		return nil
	case device.ShareLegacyIPC:
		if c.cdev == nil || len(l.Legacy) != 64 {
			return fmt.Errorf("%w: legacy lease with a %d-byte handle", ErrProtocol, len(l.Legacy))
		}
		sh := device.Shareable{Kind: device.ShareLegacyIPC, FD: -1, SlabSize: l.SlabSize, Size: l.SlabSize}
		copy(sh.Legacy[:], l.Legacy)
		b, err := c.cdev.OpenIPC(sh)
		if err != nil {
			return err
		}
		s.imp, s.base = b, b.Ptr()
		return nil
	}
	return fmt.Errorf("%w: slab kind %v", ErrProtocol, l.Kind)
}

func (s *slabMap) close() {
	select {
	case <-s.ready:
	default:
		return
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
	if s.imp != nil {
		s.imp.Free()
		s.imp = nil
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// unmap drops the mappings of slabs the daemon released (their ids are
// never reused, and a released slab holds none of this client's buffers).
func (c *Client) unmap(ids []uint64) {
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	var gone []*slabMap
	for _, id := range ids {
		if s, ok := c.slabs[id]; ok {
			gone = append(gone, s)
			delete(c.slabs, id)
		}
	}
	c.mu.Unlock()
	for _, s := range gone {
		s.close()
	}
}

// quietFree says whether the lease can be freed by a request that wants no
// reply: the daemon honours NoReply and the lease is in a shared slab, which
// a free never releases (a buffer in a slab of its own, legacy buffers
// included, releases its slab with it, and the free's reply says so at
// once). Shared slabs the daemon releases later are listed in the next
// lease reply.
func (c *Client) quietFree(l Lease) bool {
	return c.hello.NoReply && l.Kind != device.ShareLegacyIPC && l.SlabSize == c.hello.SlabSize
}

// freeHandle drops a lease without waiting for the reply (one message,
// not a round trip): the daemon serves a connection's requests in order, so
// every later call of this client sees the memory freed. quiet asks for no
// reply at all (see quietFree); otherwise the reply's released slabs are
// unmapped when it arrives.
func (c *Client) freeHandle(h uint64, quiet bool) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// The daemon dropped every lease of this connection already.
		return nil
	}
	if quiet {
		return c.wrap(OpFree, c.rpc.Tell(context.Background(), OpFree, FreeRequest{Handle: h}))
	}
	err := c.rpc.Go(context.Background(), OpFree, FreeRequest{Handle: h}, func(m *ipc.Message, fds []int) {
		ipc.CloseFDs(fds)
		var r FreeReply
		if m != nil && m.Err == nil && ipc.UnmarshalBody(m.Body, &r) == nil {
			c.unmap(r.Dropped)
		}
	})
	return c.wrap(OpFree, err)
}

// Free frees b (a buffer this client returned); the same as b.Free().
func (c *Client) Free(b *device.Buffer) error { return b.Free() }

// Remove removes a named buffer (gpupool rm): the name is unbound at once
// and the daemon drops its own lease; the memory returns when the last
// client lease on it is freed. Only the creator's uid (or root) may do this
// (ErrNotOwner).
func (c *Client) Remove(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrBadName)
	}
	var r FreeReply
	_, err := c.rpc.Call(context.Background(), OpFree, FreeRequest{Name: name}, &r)
	if err == nil {
		c.unmap(r.Dropped)
	}
	return c.wrap(OpFree, err)
}

// FreeName is Remove (the name it had before rm existed).
func (c *Client) FreeName(name string) error { return c.Remove(name) }

// Ls lists the daemon's allocations, asking page after page (LsRequest)
// until the listing is complete. Buffers made or removed meanwhile may or
// may not be listed; none is listed twice.
func (c *Client) Ls() ([]BufferInfo, error) {
	var out []BufferInfo
	var req LsRequest
	for {
		var r LsReply
		if _, err := c.rpc.Call(context.Background(), OpLs, req, &r); err != nil {
			return out, c.wrap(OpLs, err)
		}
		out = append(out, r.Buffers...)
		if r.Next == "" {
			return out, nil
		}
		if r.Next <= req.After {
			return out, fmt.Errorf("%w: ls cursor %q does not advance past %q", ErrProtocol, r.Next, req.After)
		}
		req.After = r.Next
	}
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
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return fmt.Errorf("%w: %s: %w", ErrClosed, op, err)
		}
		if errors.Is(err, ipc.ErrTimeout) {
			return fmt.Errorf("%w: %s: the daemon at %s did not answer in time, so the connection was closed (%w); buffers mapped here stay valid until freed or Close", ErrClosed, op, c.path, err)
		}
		return fmt.Errorf("%w: %s: the daemon at %s is gone (%w); buffers mapped here stay valid until freed or Close", ErrClosed, op, c.path, err)
	}
	return err
}

// Close ends the connection (the daemon releases every lease it held),
// unmaps the slabs and destroys the events this client opened; a device the
// client opened itself is closed. Buffers of this client must not be used
// afterwards.
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
	slabs, events := c.slabs, c.events
	c.slabs, c.events = nil, nil
	c.mu.Unlock()
	for _, s := range slabs {
		s.close()
	}
	c.closeEvents(events)
	if c.ownDev {
		if e := c.cdev.Close(); err == nil {
			err = e
		}
	}
	return err
}

var _ device.Allocator = (*Client)(nil)
