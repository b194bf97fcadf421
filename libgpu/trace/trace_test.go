package trace

import (
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// sink is a minimal collector: it decodes every datagram it receives.
type sink struct {
	path string
	l    *net.UnixListener
	mu   sync.Mutex
	recs []Record
	pids map[uint32]bool
	bad  int
	wg   sync.WaitGroup
}

func newSink(t *testing.T) *sink {
	t.Helper()
	s := &sink{path: filepath.Join(t.TempDir(), "c.sock"), pids: map[uint32]bool{}}
	l, err := net.ListenUnix(Network, &net.UnixAddr{Name: s.path, Net: Network})
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				buf := make([]byte, MaxBatch+1)
				for {
					n, err := c.Read(buf)
					if err != nil || n == 0 {
						return
					}
					b, err := DecodeBatch(buf[:n])
					s.mu.Lock()
					if err != nil {
						s.bad++
					} else {
						s.pids[b.PID] = true
						s.recs = append(s.recs, b.Records...)
					}
					s.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); s.wg.Wait() })
	return s
}

func (s *sink) records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.recs...)
}

// waitFor polls until n records arrived (the sender runs on its own clock).
func (s *sink) waitFor(t *testing.T, n int) []Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := s.records()
		if len(r) >= n || time.Now().After(deadline) {
			return r
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNilTracerIsOff(t *testing.T) {
	var tr *Tracer
	sp := tr.Begin("c", "n")
	sp.Arg(Int("k", 1))
	sp.FlowOut(3)
	sp.End()
	tr.Instant("c", "i")
	tr.Counter("x", 1)
	sp2 := tr.Track("t").Begin("c", "n")
	sp2.End()
	if tr.Enabled() || tr.Close() != nil || tr.Stats() != (Stats{}) || tr.Summary() != "" || tr.Now() != 0 {
		t.Fatal("nil tracer is not inert")
	}
	g, err := NewGPUTimer(nil, nil, "s")
	if g != nil || err != nil {
		t.Fatal("GPU timer of a nil tracer")
	}
	g.Begin("gpu", "x").End()
	if g.Close() != nil {
		t.Fatal("nil GPU timer Close")
	}
}

func TestSetupOffWithoutSocket(t *testing.T) {
	t.Setenv(EnvSocket, "")
	if tr := Setup("", "x"); tr != nil || Default() != nil {
		t.Fatal("tracing on without --trace or GPUKIT_TRACE")
	}
}

// TestEventsArrive: spans, instants, counters, tracks and flows reach the
// collector with their fields, in each track's order, with sane times.
func TestEventsArrive(t *testing.T) {
	s := newSink(t)
	t.Setenv(EnvSocket, s.path)
	tr := FromEnv("unit")
	if tr == nil || Default() != tr {
		t.Fatal("FromEnv did not turn tracing on")
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	n := 500 + r.IntN(500)
	flow := 1 + r.Uint64N(1<<60)
	before := tr.Now()
	wk := tr.Track("worker")
	for i := 0; i < n; i++ {
		sp := wk.Begin("unit", "work")
		sp.Arg(Int("i", int64(i)))
		if i == 0 {
			sp.FlowOut(flow)
		}
		sp.End()
	}
	tr.Instant("unit", "mark", Str("k", "v"))
	tr.Counter("bytes", float64(n))
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if Default() != nil {
		t.Fatal("Close left the Default set")
	}
	recs := s.waitFor(t, n+4)
	var spans []Record
	var proc, track, inst, ctr int
	for _, rec := range recs {
		switch rec.Kind {
		case KindSpan:
			spans = append(spans, rec)
		case KindProcess:
			proc++
			if rec.Name != "unit" {
				t.Errorf("process name %q", rec.Name)
			}
		case KindTrack:
			track++
			if rec.Name != "worker" || rec.Track != wk.id {
				t.Errorf("track %+v", rec)
			}
		case KindInstant:
			inst++
			if rec.Name != "mark" || rec.NArgs != 1 || rec.Args[0].Str != "v" {
				t.Errorf("instant %+v", rec)
			}
		case KindCounter:
			ctr++
			if rec.Value != float64(n) {
				t.Errorf("counter %v", rec.Value)
			}
		}
	}
	if len(spans) != n || proc != 1 || track < 1 || inst != 1 || ctr != 1 {
		t.Fatalf("%d spans (want %d), %d process, %d track, %d instant, %d counter records", len(spans), n, proc, track, inst, ctr)
	}
	end := tr.Now()
	for i, sp := range spans {
		if sp.Args[0].Int != int64(i) || sp.Track != wk.id || sp.Start < before || sp.Start+sp.Dur > end {
			t.Fatalf("span %d: %+v (window %d..%d)", i, sp, before, end)
		}
		if i > 0 && sp.Start < spans[i-1].Start+spans[i-1].Dur {
			t.Fatalf("span %d starts before span %d ended", i, i-1)
		}
		if (i == 0) != (sp.FlowDir == FlowOut && sp.Flow == flow) {
			t.Fatalf("span %d flow %d/%d", i, sp.FlowDir, sp.Flow)
		}
	}
	if st := tr.Stats(); st.Sent != uint64(len(recs)-proc-track) && st.Dropped != 0 {
		t.Fatalf("stats %+v for %d records", st, len(recs))
	}
	if tr.Close() != ErrClosed {
		t.Fatal("second Close")
	}
}

// TestCollectorDown: with nothing listening the tool runs on, and every
// event is counted as dropped with the reason.
func TestCollectorDown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nobody.sock")
	tr := Open(path, "lonely", Options{})
	n := 1000 + rand.IntN(1000)
	for i := 0; i < n; i++ {
		sp := tr.Begin("c", "n")
		sp.End()
	}
	tr.Close()
	st := tr.Stats()
	if st.Dropped != uint64(n) || st.Sent != 0 || st.LastErr == nil {
		t.Fatalf("stats %+v after %d events", st, n)
	}
	if s := tr.Summary(); !strings.Contains(s, "dropped") || !strings.Contains(s, path) {
		t.Fatalf("summary %q", s)
	}
}

// TestCollectorGoneMidRun: a collector that stops reading makes sends time
// out; events are dropped, recording never blocks, and Close returns.
func TestCollectorStalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stall.sock")
	l, err := net.ListenUnix(Network, &net.UnixAddr{Name: path, Net: Network})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // accept and never read
		c, err := l.AcceptUnix()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, io.LimitReader(c, 0))
			time.Sleep(time.Hour)
		}
	}()
	tr := Open(path, "stalled", Options{Buffer: 1024, SendTimeout: 20 * time.Millisecond})
	const n = 200000
	for i := 0; i < n; i++ {
		tr.Counter("x", float64(i))
	}
	tr.Close()
	st := tr.Stats()
	if st.Dropped == 0 || st.Sent+st.Dropped != n {
		t.Fatalf("stats %+v after %d events", st, n)
	}
}

// TestNoAllocsWhenOn: recording an event allocates nothing.
func TestNoAllocsWhenOn(t *testing.T) {
	s := newSink(t)
	tr := Open(s.path, "allocs", Options{})
	defer tr.Close()
	k := tr.Track("k")
	flow := rand.Uint64() | 1
	cases := map[string]func(){
		"span": func() {
			sp := k.Begin("cat", "name")
			sp.Arg(Int("bytes", 4096))
			sp.Arg(Str("op", "alloc"))
			sp.FlowIn(flow)
			sp.End()
		},
		"instant":  func() { tr.Instant("cat", "name", Int("a", 1), Float("b", 2)) },
		"counter":  func() { tr.Counter("bytes", 12345) },
		"complete": func() { k.Complete("gpu", "x", tr.Now(), 1000, Int("step", 3)) },
	}
	for name, f := range cases {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocations per event", name, a)
		}
	}
}

func TestSetupPrefersFlag(t *testing.T) {
	s := newSink(t)
	t.Setenv(EnvSocket, filepath.Join(t.TempDir(), "other.sock"))
	tr := Setup(s.path, "flagged")
	tr.Instant("c", "i")
	tr.Close()
	if recs := s.waitFor(t, 2); len(recs) < 2 {
		t.Fatalf("%d records on the --trace socket", len(recs))
	}
}

func BenchmarkSpan(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.sock")
	l, err := net.ListenUnix(Network, &net.UnixAddr{Name: path, Net: Network})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, MaxBatch)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	tr := Open(path, "bench", Options{})
	defer tr.Close()
	b.ReportAllocs()
	for b.Loop() {
		sp := tr.Begin("bench", "span")
		sp.Arg(Int("i", 1))
		sp.End()
	}
}

func BenchmarkSpanOff(b *testing.B) {
	var tr *Tracer
	b.ReportAllocs()
	for b.Loop() {
		sp := tr.Begin("bench", "span")
		sp.Arg(Int("i", 1))
		sp.End()
	}
}
