package server

import (
	"context"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

var fuzzOps = []string{pool.OpHello, pool.OpAlloc, pool.OpOpen, pool.OpSeal, pool.OpEvent, pool.OpFree, pool.OpLs, pool.OpStats, "bogus"}

// FuzzHandle feeds arbitrary bodies to every op of one session, twice in a
// row (so a lease from the first can meet the second), with or without
// noreply (the op byte's high bit): the daemon must
// answer each with a reply or an error, never panic, and keep its books
// consistent (used bytes never negative, stats agree with ls).
func FuzzHandle(f *testing.F) {
	enc := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	f.Add(uint8(1), enc(pool.AllocRequest{Name: "a", Size: 100, Unsealed: true, DType: "f32", Shape: []int64{5, 5}}), uint8(3), enc(pool.SealRequest{Handle: 1}))
	f.Add(uint8(1), enc(pool.AllocRequest{Size: 1 << 21}), uint8(5), enc(pool.FreeRequest{Handle: 1}))
	f.Add(uint8(1), enc(pool.AllocRequest{Name: "x/y", Size: 7, Keep: true}), uint8(2), enc(pool.OpenRequest{Name: "x/y", WaitMS: 5}))
	f.Add(uint8(1), enc(pool.AllocRequest{Name: "l", Size: 7, Legacy: true}), uint8(4), enc(pool.EventRequest{Handle: 1, IPC: make([]byte, 64)}))
	f.Add(uint8(5), enc(pool.FreeRequest{Name: "nope"}), uint8(6), []byte(nil))
	f.Add(uint8(0), []byte{0xc1}, uint8(8), []byte{0x80})
	f.Add(uint8(0x81), enc(pool.AllocRequest{Size: 100}), uint8(1), enc(pool.AllocRequest{Size: 100}))
	f.Add(uint8(6), enc(pool.LsRequest{After: "u:0000000000000001:0000000000000000", Limit: 1}), uint8(6), enc(pool.LsRequest{After: "n:a"}))
	f.Fuzz(func(t *testing.T, op1 uint8, body1 []byte, op2 uint8, body2 []byte) {
		p := New(Config{SlabSize: 1 << 20, Limit: 8 << 20, MaxWait: time.Millisecond})
		defer p.Close()
		a, b, err := ipc.Pair()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		defer b.Close()
		sess, err := p.Connect(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct {
			op   uint8
			body []byte
		}{{op1, body1}, {op2, body2}} {
			m := &ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 1, Op: fuzzOps[int(step.op&0x7f)%len(fuzzOps)], Body: step.body,
				NoReply: step.op&0x80 != 0}
			reply, fds, err := sess.Handle(context.Background(), m, nil)
			ipc.CloseFDs(fds)
			if err == nil {
				if _, err := ipc.MarshalBody(reply); err != nil {
					t.Fatalf("%s: reply does not encode: %v", m.Op, err)
				}
			}
		}
		s := p.Stats()
		ls, _, _ := p.ls(pool.LsRequest{})
		var used int64
		for _, bi := range ls.Buffers {
			used += device256(bi.Size)
		}
		if s.Used < 0 || s.Used != used || s.Allocations != len(ls.Buffers) || s.Reserved > 8<<20+(1<<20) {
			t.Fatalf("books: %+v, ls sums to %d over %d buffers", s, used, len(ls.Buffers))
		}
		sess.Close()
		if s := p.Stats(); s.Allocations != 0 && s.Named == 0 {
			// Only kept (named) buffers outlive the session.
			t.Fatalf("after close: %+v", s)
		}
	})
}
