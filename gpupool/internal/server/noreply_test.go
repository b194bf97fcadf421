package server

import (
	"context"
	"slices"
	"testing"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// A free that wants no reply does not swallow the slab-release notices
// (here of the slab it released itself): they ride on the connection's
// next lease.
func TestNoReplyFreeKeepsDropped(t *testing.T) {
	p := New(Config{SlabSize: 1 << 20})
	defer p.Close()
	session := func() ipc.Session {
		a, b, err := ipc.Pair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		s, err := p.Connect(a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	call := func(s ipc.Session, op string, body any, noReply bool) (any, error) {
		t.Helper()
		raw, err := ipc.MarshalBody(body)
		if err != nil {
			t.Fatal(err)
		}
		r, fds, err := s.Handle(context.Background(), &ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 1, Op: op, Body: raw, NoReply: noReply}, nil)
		ipc.CloseFDs(fds)
		return r, err
	}
	a := session()
	// A buffer in a slab of its own: its free releases the slab.
	r, err := call(a, pool.OpAlloc, pool.AllocRequest{Size: 3 << 19}, false)
	if err != nil {
		t.Fatal(err)
	}
	first := r.(pool.Lease)
	if r, err := call(a, pool.OpFree, pool.FreeRequest{Handle: first.Handle}, true); err != nil || r != nil {
		t.Fatalf("no-reply free: %v, %v", r, err)
	}
	// Another no-reply free (of a bad handle: it fails) sends nothing.
	if r, err := call(a, pool.OpFree, pool.FreeRequest{Handle: 99}, true); err == nil || r != nil {
		t.Fatalf("bad no-reply free: %v, %v", r, err)
	}
	r, err = call(a, pool.OpAlloc, pool.AllocRequest{Size: 100}, false)
	if err != nil {
		t.Fatal(err)
	}
	if l := r.(pool.Lease); !slices.Equal(l.Dropped, []uint64{first.Slab}) || l.Slab == first.Slab {
		t.Fatalf("next lease: slab %d, dropped %v; want a new slab and dropped [%d]", l.Slab, l.Dropped, first.Slab)
	}
}
