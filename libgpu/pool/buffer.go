package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
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
	own cuda.Event // the interprocess event Ready records; 0 until the first Ready
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
// runs on. It uses an interprocess CUDA event (cuEventCreate with
// CU_EVENT_INTERPROCESS|CU_EVENT_DISABLE_TIMING, cuIpcGetEventHandle) that
// the first Ready creates and registers with the daemon; it lives until the
// buffer is freed or this process's connection ends. On a host pool writes
// are complete when they return, and Ready does nothing.
func (b *Buffer) Ready(s cuda.Stream) error {
	d := b.c.cdev
	if d == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.own == 0 {
		var ev cuda.Event
		var h cuda.IpcEventHandle
		err := d.Do(func() error {
			var err error
			if ev, err = cuda.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming); err != nil {
				return err
			}
			if h, err = cuda.IpcGetEventHandle(ev); err != nil {
				ev.Destroy()
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("pool: interprocess event for %q: %w", b.lease.Name, err)
		}
		if _, err := b.c.rpc.Call(context.Background(), OpEvent, EventRequest{Handle: b.lease.Handle, IPC: h[:]}, nil); err != nil {
			d.Do(ev.Destroy)
			return b.c.wrap(OpEvent, err)
		}
		registerOwn(h, ev)
		b.own = ev
	}
	if err := d.Do(func() error { return b.own.Record(s) }); err != nil {
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
	if err := d.Do(func() error { return s.WaitEvent(ev) }); err != nil {
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
	b.own = 0
	b.mu.Unlock()
	if ev != 0 {
		forgetOwn(ev)
		if e := b.c.cdev.Do(ev.Destroy); err == nil {
			err = e
		}
	}
	return err
}

// Events this process created (cuIpcOpenEventHandle cannot open them here):
// by handle, so a Wait in the producer's own process uses the event itself.
var own = struct {
	sync.Mutex
	m map[[64]byte]cuda.Event
}{m: map[[64]byte]cuda.Event{}}

func registerOwn(h cuda.IpcEventHandle, ev cuda.Event) {
	own.Lock()
	own.m[h] = ev
	own.Unlock()
}

func forgetOwn(ev cuda.Event) {
	own.Lock()
	defer own.Unlock()
	for h, e := range own.m {
		if e == ev {
			delete(own.m, h)
		}
	}
}

type eventRef struct{ ev cuda.Event }

// openEvent returns the event with IPC handle h: this process's own, or
// one opened here once (cuIpcOpenEventHandle) and kept until Close.
func (c *Client) openEvent(h [64]byte) (cuda.Event, error) {
	own.Lock()
	ev, ok := own.m[h]
	own.Unlock()
	if ok {
		return ev, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	if r, ok := c.events[h]; ok {
		return r.ev, nil
	}
	err := c.cdev.Do(func() error {
		var err error
		ev, err = cuda.IpcOpenEventHandle(cuda.IpcEventHandle(h))
		return err
	})
	if err != nil {
		return 0, err
	}
	c.events[h] = eventRef{ev}
	return ev, nil
}

func (c *Client) closeEvents(m map[[64]byte]eventRef) {
	if c.cdev == nil {
		return
	}
	for _, r := range m {
		ev := r.ev
		c.cdev.Do(ev.Destroy)
	}
}

// Lease is what the daemon replied when this buffer was leased.
func (b *Buffer) Lease() Lease {
	l := b.lease
	l.Shape = slices.Clone(l.Shape)
	return l
}
