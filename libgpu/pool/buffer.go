package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
)

// Buffer is a leased pool buffer: a *device.Buffer (its memory) with what
// the daemon said about it, and the named-buffer life cycle (Seal) and
// cross-process ordering (Ready, Wait). Free (of the embedded Buffer) drops
// the lease.
type Buffer struct {
	*device.Buffer
	c     *Client
	lease Lease

	mu  sync.Mutex
	own *exec.IPCEvent // the interprocess event Ready records; nil until the first Ready
}

// Name is the buffer's name ("" for an anonymous allocation).
func (b *Buffer) Name() string { return b.lease.Name }

// DType is the dtype metadata given at creation ("" if none).
func (b *Buffer) DType() string { return b.lease.DType }

// Shape is the shape metadata given at creation (nil if none).
func (b *Buffer) Shape() []int64 { return slices.Clone(b.lease.Shape) }

// Sealed says whether the buffer was sealed when this lease was taken.
func (b *Buffer) Sealed() bool { return b.lease.Sealed }

// Handle is the lease's handle on this connection.
func (b *Buffer) Handle() uint64 { return b.lease.Handle }

// Seal marks the buffer complete: opens waiting on its name proceed. On a
// GPU, order the writes first (Ready on the writing stream, or a sync):
// sealing says nothing about work still queued. ErrNotOwner for a buffer
// created by another uid.
func (b *Buffer) Seal() error {
	_, err := b.c.rpc.Call(context.Background(), OpSeal, SealRequest{Handle: b.lease.Handle}, nil)
	return b.c.wrap(OpSeal, err)
}

// Ready records, on stream s, that the work queued so far (the writes of
// this buffer) must finish before any stream that later Waits on the buffer
// runs on. It uses an interprocess CUDA event (exec.IPCEvent) that the
// first Ready creates and registers with the daemon; it lives until the
// buffer is freed or this process's connection ends. On a host pool writes
// are complete when they return, and Ready does nothing.
func (b *Buffer) Ready(s cuda.Stream) error {
	d := b.c.cdev
	if d == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.own == nil {
		ev, err := exec.NewIPCEvent(d)
		if err != nil {
			return fmt.Errorf("pool: interprocess event for %q: %w", b.lease.Name, err)
		}
		h := ev.Handle()
		if _, err := b.c.rpc.Call(context.Background(), OpEvent, EventRequest{Handle: b.lease.Handle, IPC: h[:]}, nil); err != nil {
			ev.Close()
			return b.c.wrap(OpEvent, err)
		}
		b.own = ev
	}
	if err := b.own.Record(s); err != nil {
		return fmt.Errorf("pool: record event of %q: %w", b.lease.Name, err)
	}
	return nil
}

// Wait makes later work on stream s wait for the work the buffer's
// producer marked with its last Ready (cuStreamWaitEvent; the host does not
// block). The producer's Ready must come first (the usual order: producer
// writes, Ready, Seal; consumer OpenWait, Wait). ErrNoEvent when no
// process has called Ready on the buffer, or its process has gone. On a
// host pool it does nothing.
func (b *Buffer) Wait(s cuda.Stream) error {
	d := b.c.cdev
	if d == nil {
		return nil
	}
	var r EventReply
	if _, err := b.c.rpc.Call(context.Background(), OpEvent, EventRequest{Handle: b.lease.Handle}, &r); err != nil {
		return b.c.wrap(OpEvent, err)
	}
	if len(r.IPC) != 64 {
		return fmt.Errorf("%w: %q", ErrNoEvent, b.lease.Name)
	}
	ev, err := b.c.openEvent([64]byte(r.IPC))
	if err != nil {
		return fmt.Errorf("pool: open the event of %q: %w", b.lease.Name, err)
	}
	if err := ev.Wait(s); err != nil {
		return fmt.Errorf("pool: wait for %q: %w", b.lease.Name, err)
	}
	return nil
}

// release is the embedded device.Buffer's free: drop the lease, then the
// event this buffer owns.
func (b *Buffer) release() error {
	err := b.c.freeHandle(b.lease.Handle, b.c.quietFree(b.lease))
	b.mu.Lock()
	ev := b.own
	b.own = nil
	b.mu.Unlock()
	if e := ev.Close(); err == nil {
		err = e
	}
	return err
}

// openEvent returns the event with IPC handle h (exec.OpenIPCEvent: this
// process's own, or one opened here once and kept until Close).
func (c *Client) openEvent(h [64]byte) (*exec.IPCEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if ev, ok := c.events[h]; ok {
		return ev, nil
	}
	ev, err := exec.OpenIPCEvent(c.cdev, h)
	if err != nil {
		return nil, err
	}
	if ev.Owned() {
		c.events[h] = ev // another process's: opened once
	}
	return ev, nil
}

func (c *Client) closeEvents(m map[[64]byte]*exec.IPCEvent) {
	for _, ev := range m {
		ev.Close()
	}
}

// Lease is what the daemon replied when this buffer was leased.
func (b *Buffer) Lease() Lease {
	l := b.lease
	l.Shape = slices.Clone(l.Shape)
	return l
}
