package server

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gpukit/libgpu/trace"
)

// collector is a minimal trace collector: it accepts unixpacket
// connections on a temp socket and decodes every batch it gets.
type collector struct {
	path string
	mu   sync.Mutex
	recs []trace.Record
	errs []error
	eof  chan struct{} // gets a value when a connection ends
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{path: filepath.Join(t.TempDir(), "trace.sock"), eof: make(chan struct{}, 16)}
	l, err := net.ListenUnix(trace.Network, &net.UnixAddr{Name: c.path, Net: trace.Network})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer func() { conn.Close(); c.eof <- struct{}{} }()
				buf := make([]byte, trace.MaxBatch)
				for {
					n, err := conn.Read(buf)
					if err != nil || n == 0 {
						return
					}
					b, err := trace.DecodeBatch(buf[:n])
					c.mu.Lock()
					if err != nil {
						c.errs = append(c.errs, err)
					}
					c.recs = append(c.recs, b.Records...)
					c.mu.Unlock()
				}
			}()
		}
	}()
	return c
}

// records waits until a connection has ended (the tracer was closed) and
// returns what came.
func (c *collector) records(t *testing.T) []trace.Record {
	t.Helper()
	select {
	case <-c.eof:
	case <-time.After(10 * time.Second):
		t.Fatal("the tracer's connection did not end")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		t.Fatalf("malformed batches: %v", c.errs)
	}
	return append([]trace.Record(nil), c.recs...)
}

// TestTraceRequestsAndCounters: with tracing on, every request is a span of
// category "pool" named by its op on a track named after the client's pid,
// the incoming end of the flow whose outgoing end is the client's "ipc"
// span; the pool.used counter follows the allocations up and back to 0,
// and pool.reserved is a whole number of slabs.
func TestTraceRequestsAndCounters(t *testing.T) {
	col := newCollector(t)
	tr := trace.Open(col.path, "gpupool-test", trace.Options{FlushEvery: time.Millisecond})
	trace.SetDefault(tr)
	defer trace.SetDefault(nil)

	const slabSize = 1 << 20
	path, _ := startPool(t, backend{name: "host"}, testConfig{SlabSize: slabSize})
	c := dial(t, path)
	r := rand.New(rand.NewPCG(rand.Uint64(), 7))
	sizes := []int64{1 + r.Int64N(1000), 1 + r.Int64N(100_000), 1 + r.Int64N(3*slabSize)}
	for _, n := range sizes {
		b, err := c.Alloc("", n)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	// A Stats call after the frees: replies keep their order, so the frees
	// have been handled when it returns.
	if _, err := c.Stats(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if s := tr.Stats(); s.Dropped != 0 {
		t.Fatalf("dropped events: %+v", s)
	}

	recs := col.records(t)
	wantTrack := fmt.Sprintf("conn pid %d", os.Getpid())
	connTrack := uint32(0)
	for _, rec := range recs {
		if rec.Kind == trace.KindTrack && rec.Name == wantTrack {
			connTrack = rec.Track
		}
	}
	if connTrack == 0 {
		t.Fatalf("no track %q", wantTrack)
	}
	out := map[uint64]string{} // flow → op, from the client's ipc spans
	in := map[uint64]string{}  // flow → op, from the pool's spans
	ops := map[string]int{}
	var used, reserved []float64
	for _, rec := range recs {
		switch {
		case rec.Kind == trace.KindSpan && rec.Cat == "ipc" && rec.FlowDir == trace.FlowOut:
			out[rec.Flow] = rec.Name
		case rec.Kind == trace.KindSpan && rec.Cat == traceCategory:
			if rec.Track != connTrack {
				t.Fatalf("pool span %q on track %d, want the connection's %d", rec.Name, rec.Track, connTrack)
			}
			if rec.FlowDir != trace.FlowIn || rec.Flow == 0 {
				t.Fatalf("pool span %q is not the end of a flow: %+v", rec.Name, rec)
			}
			in[rec.Flow] = rec.Name
			ops[rec.Name]++
		case rec.Kind == trace.KindCounter && rec.Name == counterUsed:
			used = append(used, rec.Value)
		case rec.Kind == trace.KindCounter && rec.Name == counterReserved:
			reserved = append(reserved, rec.Value)
		}
	}
	if ops["alloc"] != len(sizes) || ops["free"] != len(sizes) || ops["stats"] != 1 {
		t.Fatalf("pool spans by op %v, want %d alloc, %d free, 1 stats", ops, len(sizes), len(sizes))
	}
	for flow, op := range in {
		if out[flow] != op {
			t.Fatalf("pool span %q of flow %x has no client ipc span of that flow (got %q)", op, flow, out[flow])
		}
	}
	// Each allocation is freed before the next: used goes to each aligned
	// size and back to 0 (samples repeat when reserved changes alone).
	var steps []float64
	for _, v := range used {
		if (len(steps) == 0 && v != 0) || (len(steps) > 0 && v != steps[len(steps)-1]) {
			steps = append(steps, v)
		}
	}
	var want []float64
	for _, n := range sizes {
		want = append(want, float64(device256(n)), 0)
	}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("pool.used went %v (samples %v), want %v", steps, used, want)
	}
	// The shared slab stays (no --idle); a dedicated one goes with its buffer.
	if len(reserved) == 0 || reserved[len(reserved)-1] != slabSize {
		t.Fatalf("pool.reserved samples %v: want the last to be one shared slab, %d", reserved, slabSize)
	}
}
