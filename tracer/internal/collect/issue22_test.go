package collect

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

// waitBatches waits until the collector has read n batches (taken or
// refused).
func waitBatches(t *testing.T, f *fixture, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := f.c.Stats(); st.Batches+st.Rejected >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("batches not read: %+v", f.c.Stats())
		}
	}
}

// Issue 22, item 4: a connection writes for its own process only. Batches
// naming other pids (to rename other processes, claim their dropped
// counts, or grow the collector's state with a new pid each) are refused
// and counted; the collector's state does not grow with them, and what a
// connection held goes when it closes.
func TestConnectionWritesForItsProcessOnly(t *testing.T) {
	f := start(t)
	conn := dial(t, f.sock)
	conn.Write(batch(self, trace.Record{Kind: trace.KindProcess, Name: "me"}))
	const n = 3000
	for i := 0; i < n; i++ {
		b := trace.AppendBatchHeader(nil, uint32(100000+i), 1<<32-1, 1)
		b = trace.AppendRecord(b, &trace.Record{Kind: trace.KindProcess, Name: "impostor"})
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	waitBatches(t, f, n+1)
	f.c.mu.Lock()
	procs := len(f.c.procs)
	f.c.mu.Unlock()
	st := f.c.Stats()
	if st.Foreign != n || st.Rejected != n || st.ClientDropped != 0 || procs > 2 {
		t.Fatalf("after %d batches for other pids: %d processes held; %+v", n, procs, st)
	}
	conn.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		f.c.mu.Lock()
		_, held := f.c.procs[self]
		f.c.mu.Unlock()
		// The collector's own entry is this pid too (one process plays
		// both); it goes with the connection's and comes back with the
		// collector's next own event.
		if !held && f.c.Idle() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the closed connection's process state is still held")
		}
	}
	out := f.stop(t)
	for _, e := range out.Events {
		if e.Ph == "M" && e.Args["name"] == "impostor" {
			t.Fatalf("an impostor's name reached the file: %+v", e)
		}
	}
}

// Issue 22, item 4: one connection's waiting flow ends are bounded
// (maxConnFlows, its own oldest go first): a flood of unpaired ends
// neither grows the collector without bound nor pushes out another
// process's waiting end, which still pairs.
func TestFlowEndsBoundedPerConnection(t *testing.T) {
	f := start(t)
	// Another process's request waits for its handler (Ingest: a
	// process of its own).
	f.c.Ingest(&trace.Batch{PID: 4242, Records: []trace.Record{{Kind: trace.KindSpan, Name: "req", Start: 1, Dur: 5, FlowDir: trace.FlowOut, Flow: 77}}})
	conn := dial(t, f.sock)
	defer conn.Close()
	const flood = 5 * maxConnFlows
	sent := uint64(0)
	for i := 0; i < flood; {
		var recs []trace.Record
		for k := 0; k < 200 && i < flood; k, i = k+1, i+1 {
			recs = append(recs, trace.Record{Kind: trace.KindSpan, Name: "x", Start: int64(i), FlowDir: trace.FlowOut, Flow: uint64(1000 + i)})
		}
		conn.Write(batch(self, recs...))
		sent++
	}
	waitBatches(t, f, sent+1)
	if st := f.c.Stats(); st.UnpairedFlows > maxConnFlows+1 {
		t.Fatalf("%d flow ends waiting after a flood from one connection", st.UnpairedFlows)
	}
	f.c.mu.Lock()
	order := len(f.c.flowOrder)
	f.c.mu.Unlock()
	if order > 2*(maxConnFlows+1)+1024 {
		t.Fatalf("%d ids in the eviction order for %d waiting ends", order, maxConnFlows+1)
	}
	f.c.Ingest(&trace.Batch{PID: 4343, Records: []trace.Record{{Kind: trace.KindSpan, Name: "handle", Start: 2, Dur: 1, FlowDir: trace.FlowIn, Flow: 77}}})
	out := f.stop(t)
	sum, err := out.Validate()
	if err != nil {
		t.Fatal(err)
	}
	if sum.CrossFlows != 1 {
		t.Fatalf("the other process's flow did not pair: %+v", sum)
	}
}

// Issue 22, item 4: the collector admits its own uid and root unless told
// otherwise; a peer it does not admit is told so and closed, and nothing
// it sends is taken. (This process's uid is made the refused one.)
func TestCollectorRefusesUnadmitted(t *testing.T) {
	f := start(t)
	f.c.mu.Lock()
	f.c.Admission = ipc.Admission{Self: uint32(os.Geteuid()) + 1}
	if os.Geteuid() == 0 {
		f.c.Admission.Self = 12345 // root is not admitted without Root
	}
	f.c.mu.Unlock()
	tr := trace.Open(f.sock, "refused", trace.Options{})
	tr.Instant("c", "secret")
	tr.Close()
	for deadline := time.Now().Add(10 * time.Second); f.c.Stats().Refused == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("collector stats %+v", f.c.Stats())
		}
	}
	out := f.stop(t)
	for _, e := range out.Events {
		if e.Name == "secret" {
			t.Fatal("a refused peer's event reached the file")
		}
	}
}

// FuzzIngest: whatever a connection sends, the collector's decoder and
// its taking of the batch for the connection's process never panic, and
// its state stays within bounds: one process (the sender's), waiting flow
// ends at most maxConnFlows of the connection's, none held once it closes
// but the waiting ends.
func FuzzIngest(f *testing.F) {
	rec := []trace.Record{
		{Kind: trace.KindProcess, Name: "p"},
		{Kind: trace.KindTrack, Track: 3, Name: "t"},
		{Kind: trace.KindSpan, Track: 3, Cat: "c", Name: "s", Start: 10, Dur: 5, FlowDir: trace.FlowOut, Flow: 99, NArgs: 1, Args: [trace.MaxArgs]trace.Arg{trace.Str("k", "v")}},
		{Kind: trace.KindInstant, Cat: "c", Name: "i", Start: 11},
		{Kind: trace.KindCounter, Name: "n", Start: 12, Value: 1.5},
	}
	f.Add(batch(self, rec...))
	f.Add(batch(self+1, rec...))
	f.Add(trace.AppendBatchHeader(nil, self, 1<<32-1, 0))
	f.Add([]byte(trace.Magic))
	w, err := chrome.Create(filepath.Join(f.TempDir(), "t.json"), 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	c := New(w, 10*time.Millisecond)
	f.Cleanup(func() { c.Close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, err := trace.DecodeBatch(b)
		if err != nil {
			return
		}
		pr := &peer{pid: self}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.ingestFrom(&batch, pr)
		if pr.pending > maxConnFlows || len(c.flows) > maxPendingFlows || len(c.procs) > 1 {
			t.Fatalf("%d waiting ends of the connection, %d in all, %d processes", pr.pending, len(c.flows), len(c.procs))
		}
		for _, p := range c.procs {
			if len(p.threads) > 1024 {
				t.Fatalf("%d threads of one process", len(p.threads))
			}
		}
		c.forget(pr)
		if len(c.procs) != 0 && !(len(c.procs) == 1 && c.procs[self] != nil && c.procs[self].conns == 0) {
			t.Fatalf("%d processes held after the close", len(c.procs))
		}
	})
}
