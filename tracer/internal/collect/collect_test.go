package collect

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

type fixture struct {
	c    *Collector
	l    *net.UnixListener
	sock string
	out  string
	done chan error
}

func start(t testing.TB) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{sock: filepath.Join(dir, "c.sock"), out: filepath.Join(dir, "t.json"), done: make(chan error, 1)}
	w, err := chrome.Create(f.out, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if f.l, err = net.ListenUnix(trace.Network, &net.UnixAddr{Name: f.sock, Net: trace.Network}); err != nil {
		t.Fatal(err)
	}
	f.c = New(w, 10*time.Millisecond)
	go func() { f.done <- f.c.Serve(f.l) }()
	return f
}

func (f *fixture) stop(t testing.TB) *chrome.Trace {
	t.Helper()
	f.c.StopServing(f.l)
	if err := <-f.done; err != nil {
		t.Fatal(err)
	}
	f.l.Close()
	f.c.Drain(2 * time.Second)
	if err := f.c.Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := chrome.ReadFile(f.out)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func dial(t testing.TB, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix(trace.Network, nil, &net.UnixAddr{Name: path, Net: trace.Network})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// self is this process's pid: the only one a connection of it may write for.
var self = uint32(os.Getpid())

func batch(pid uint32, recs ...trace.Record) []byte {
	b := trace.AppendBatchHeader(nil, pid, 0, uint16(len(recs)))
	for i := range recs {
		b = trace.AppendRecord(b, &recs[i])
	}
	return b
}

// TestClientEventsBecomeValidTrace: what a real client records ends up in
// the file as valid Chrome events with the right names, args and durations.
func TestClientEventsBecomeValidTrace(t *testing.T) {
	f := start(t)
	tr := trace.Open(f.sock, "unit-client", trace.Options{})
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	n := 100 + r.IntN(100)
	k := tr.Track("worker")
	for i := 0; i < n; i++ {
		sp := k.Begin("unit", "outer")
		sp.Arg(trace.Int("i", int64(i)))
		in := k.Begin("unit", "inner")
		in.End()
		sp.End()
	}
	tr.Counter("bytes", 42)
	tr.Instant("unit", "mark")
	tr.Close()
	out := f.stop(t)
	sum, err := out.Validate()
	if err != nil {
		t.Fatal(err)
	}
	pid := uint32(os.Getpid())
	if out.Processes[pid] != "unit-client" || out.Threads[[2]uint32{pid, tid(pid, 1)}] != "worker" {
		t.Fatalf("names %v %v", out.Processes, out.Threads)
	}
	var outer, inner, ctr, inst int
	for _, e := range out.Events {
		switch {
		case e.Ph == "X" && e.Name == "outer":
			if e.Args["i"].(float64) != float64(outer) || e.Tid != tid(pid, 1) {
				t.Fatalf("outer %d: %+v", outer, e)
			}
			outer++
		case e.Ph == "X" && e.Name == "inner":
			inner++
		case e.Ph == "C" && e.Name == "bytes":
			ctr++
		case e.Ph == "i" && e.Name == "mark":
			inst++
		}
	}
	if outer != n || inner != n || ctr != 1 || inst != 1 || sum.Processes != 1 {
		t.Fatalf("%d outer, %d inner, %d counters, %d instants (want %d, %d, 1, 1); %+v", outer, inner, ctr, inst, n, n, sum)
	}
}

// TestMalformedRejectedKeepsServing: garbage is refused and counted; the
// same connection and others go on being served.
func TestMalformedRejectedKeepsServing(t *testing.T) {
	f := start(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	conn := dial(t, f.sock)
	good := batch(self, trace.Record{Kind: trace.KindProcess, Name: "p"},
		trace.Record{Kind: trace.KindSpan, Cat: "c", Name: "ok", Start: 1000, Dur: 5})
	bad := 0
	for i := 0; i < 20; i++ {
		junk := make([]byte, 1+r.IntN(200))
		for j := range junk {
			junk[j] = byte(r.IntN(256))
		}
		if i%2 == 0 { // a right magic with a broken body
			junk = append([]byte(trace.Magic), junk...)
		}
		if _, err := conn.Write(junk); err != nil {
			t.Fatal(err)
		}
		bad++
		// A batch cut short is malformed too.
		if _, err := conn.Write(good[:len(good)-1-r.IntN(len(good)-1)]); err != nil {
			t.Fatal(err)
		}
		bad++
		if _, err := conn.Write(good); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	other := dial(t, f.sock)
	other.Write(good)
	other.Close()
	out := f.stop(t)
	if _, err := out.Validate(); err != nil {
		t.Fatal(err)
	}
	st := f.c.Stats()
	oks := 0
	for _, e := range out.Events {
		if e.Name == "ok" {
			oks++
		}
	}
	if st.Rejected != uint64(bad) || oks != 21 {
		t.Fatalf("rejected %d (want %d), %d good spans (want 21)", st.Rejected, bad, oks)
	}
}

// TestFlowsPairAcrossProcesses: ends of flows arrive from several processes
// in any order; the file holds one s/f pair per flow whose both ends came,
// nothing for the others.
func TestFlowsPairAcrossProcesses(t *testing.T) {
	f := start(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	type end struct {
		pid uint32
		rec trace.Record
	}
	var ends []end
	pairs, singles := 0, 0
	for i := 0; i < 300; i++ {
		id := r.Uint64N(1<<53-2) + 1
		client, server := uint32(100+r.IntN(3)), uint32(200+r.IntN(3))
		ts := r.Int64N(1 << 40)
		ends = append(ends, end{client, trace.Record{Kind: trace.KindSpan, Name: "req", Start: ts, Dur: 10, FlowDir: trace.FlowOut, Flow: id}})
		if r.IntN(4) == 0 {
			singles++
			continue
		}
		pairs++
		ends = append(ends, end{server, trace.Record{Kind: trace.KindSpan, Name: "handle", Start: ts + 5, Dur: 3, FlowDir: trace.FlowIn, Flow: id}})
	}
	r.Shuffle(len(ends), func(i, j int) { ends[i], ends[j] = ends[j], ends[i] })
	for _, e := range ends {
		f.c.Ingest(&trace.Batch{PID: e.pid, Records: []trace.Record{e.rec}})
	}
	out := f.stop(t)
	sum, err := out.Validate()
	if err != nil {
		t.Fatal(err)
	}
	if sum.Flows != pairs || sum.CrossFlows != pairs || f.c.Stats().UnpairedFlows != singles || sum.LinkedProcesses < 2 {
		t.Fatalf("%+v; want %d pairs, %d unpaired (got %d)", sum, pairs, singles, f.c.Stats().UnpairedFlows)
	}
	// Each finish binds to its handler span: same pid, tid and time.
	handlers := map[[3]float64]bool{}
	for _, e := range out.Events {
		if e.Ph == "X" && e.Name == "handle" {
			handlers[[3]float64{float64(e.Pid), float64(e.Tid), e.Ts}] = true
		}
	}
	for _, e := range out.Events {
		if e.Ph == "f" && !handlers[[3]float64{float64(e.Pid), float64(e.Tid), e.Ts}] {
			t.Fatalf("flow finish %+v is not at a handler span", e)
		}
	}
}

// TestClientDroppedCounted: a client's dropped count becomes a counter and a stat.
func TestClientDroppedCounted(t *testing.T) {
	f := start(t)
	d := uint32(1 + rand.IntN(1000))
	conn := dial(t, f.sock)
	b := trace.AppendBatchHeader(nil, self, d, 1)
	b = trace.AppendRecord(b, &trace.Record{Kind: trace.KindProcess, Name: "lossy"})
	conn.Write(b)
	conn.Close()
	out := f.stop(t)
	if _, err := out.Validate(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range out.Events {
		found = found || (e.Ph == "C" && e.Name == "trace.dropped" && e.Pid == self && e.Args["value"].(float64) == float64(d))
	}
	if !found || f.c.Stats().ClientDropped != uint64(d) {
		t.Fatalf("dropped counter missing; stats %+v", f.c.Stats())
	}
}

// BenchmarkIngest: events per second from a socket into the file.
func BenchmarkIngest(b *testing.B) {
	f := start(b)
	const per = 400
	recs := make([]trace.Record, per)
	for i := range recs {
		recs[i] = trace.Record{Kind: trace.KindSpan, Track: uint32(i % 4), Cat: "bench", Name: "span", Start: int64(i) * 1000, Dur: 500}
		recs[i].Args[0], recs[i].NArgs = trace.Int("i", int64(i)), 1
	}
	msg := batch(self, recs...)
	conn := dial(b, f.sock)
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := conn.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	conn.Close()
	for deadline := time.Now().Add(time.Minute); f.c.Stats().Records < uint64(b.N*per) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Microsecond)
	}
	el := time.Since(start)
	b.StopTimer()
	if got := f.c.Stats().Records; got != uint64(b.N*per) {
		b.Fatalf("%d records ingested, want %d", got, b.N*per)
	}
	b.ReportMetric(float64(b.N*per)/el.Seconds(), "events/s")
	f.stop(b)
}
