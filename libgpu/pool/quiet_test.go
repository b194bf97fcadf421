package pool

import (
	"context"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

// slabber is a fake daemon of 4 KiB memfd slabs: alloc places each
// request of at most 4 KiB in the current shared slab (size 4096) and a
// larger one in a slab of its own; it records whether each free wanted a
// reply, and lists the slabs in drop in its next lease.
type slabber struct {
	unsealed bool // send memfds without F_SEAL_SHRINK|F_SEAL_GROW
	mu       sync.Mutex
	slab     uint64 // current shared slab
	next     uint64
	sent     map[uint64]bool
	frees    []bool // NoReply of each free, in order
	drop     []uint64
	handle   uint64
}

func (f *slabber) Connect(*ipc.Conn) (ipc.Session, error) { return f, nil }
func (f *slabber) Close()                                 {}
func (f *slabber) Handle(_ context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch m.Op {
	case OpHello:
		return HelloReply{Server: "gpupool", Share: device.ShareMemfd, SlabSize: 4096, Align: 256, NoReply: true}, nil, nil
	case OpAlloc:
		var req AllocRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		slab, size := f.slab, int64(4096)
		if req.Size > 4096 {
			f.next++
			slab, size = f.next, device.RoundUp(req.Size, 4096)
		}
		l := Lease{Slab: slab, SlabSize: size, Kind: device.ShareMemfd, Size: req.Size, Dropped: f.drop}
		f.drop = nil
		f.handle++
		l.Handle = f.handle
		var fds []int
		if !f.sent[slab] {
			fd, err := unix.MemfdCreate("slabber", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				return nil, nil, err
			}
			unix.Ftruncate(fd, size)
			if !f.unsealed {
				unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
			}
			fds, l.FD = []int{fd}, true
			f.sent[slab] = true
		}
		return l, fds, nil
	case OpFree:
		f.frees = append(f.frees, m.NoReply)
		return FreeReply{}, nil, nil
	case OpStats:
		return Stats{}, nil, nil
	}
	return nil, nil, ipc.ErrUnknownOp
}

func (f *slabber) sync(t *testing.T, c *Client) []bool {
	t.Helper()
	if _, err := c.Stats(); err != nil { // served after every earlier free
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	frees := f.frees
	f.frees = nil
	return frees
}

// Frees of buffers in shared slabs want no reply from a daemon that
// honours NoReply; a buffer in a slab of its own is freed with a reply (it
// releases the slab); slabs the daemon released since are unmapped at the
// next lease.
func TestQuietFree(t *testing.T) {
	f := &slabber{slab: 1, next: 100, sent: map[uint64]bool{}}
	path := serveHandler(t, f)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Alloc("", 100)
	if err != nil {
		t.Fatal(err)
	}
	big, err := c.Alloc("", 5000)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	if err := big.Free(); err != nil {
		t.Fatal(err)
	}
	if got := f.sync(t, c); len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("free NoReply flags %v, want [true false]", got)
	}
	// The daemon releases slab 1 and moves to slab 2: the next lease says
	// so and the client unmaps slab 1.
	f.mu.Lock()
	f.drop, f.slab = []uint64{1}, 2
	f.mu.Unlock()
	if !c.mappedSlab(1) {
		t.Fatal("slab 1 not mapped before the notice")
	}
	b, err := c.Alloc("", 100)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if c.mappedSlab(1) || !c.mappedSlab(2) {
		t.Fatalf("after the notice: slab 1 mapped %v, slab 2 mapped %v", c.mappedSlab(1), c.mappedSlab(2))
	}
}

func serveHandler(t *testing.T, h ipc.Handler) string {
	path := t.TempDir() + "/slabber.sock"
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &ipc.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(srv.Shutdown)
	return path
}
