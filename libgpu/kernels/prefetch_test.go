package kernels

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gateNVRTC is a fakeNVRTC whose compilations wait at a gate: it counts
// how many run at once and lets them finish only when the test opens the
// gate (or when a job's name is in open already).
type gateNVRTC struct {
	fakeNVRTC
	inflight, peak atomic.Int32
	mu             sync.Mutex
	open           map[string]bool // job key (Unit-like "file:define") -> passes the gate
	gate           chan struct{}   // closed: everything passes
}

func newGate() *gateNVRTC {
	return &gateNVRTC{fakeNVRTC: fakeNVRTC{version: "13.0"}, open: map[string]bool{}, gate: make(chan struct{})}
}

func jobUnit(j Job) string {
	for _, f := range j.Flags {
		if k, ok := strings.CutPrefix(f, "-DGPUKIT_ONLY="); ok {
			return j.Name + ":" + k
		}
	}
	return j.Name
}

func (g *gateNVRTC) Compile(j Job) (Output, error) {
	n := g.inflight.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	defer g.inflight.Add(-1)
	g.mu.Lock()
	pass := g.open[jobUnit(j)]
	g.mu.Unlock()
	if !pass {
		<-g.gate
	}
	return g.fakeNVRTC.Compile(j)
}

// units lists the units the fake compiled, sorted.
func (g *gateNVRTC) units() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var us []string
	for _, j := range g.jobs {
		us = append(us, jobUnit(j))
	}
	slices.Sort(us)
	return us
}

// testSources: split.cu marks its kernels a, b, c with GPUKIT_KEEP; whole.cu
// does not; bad.cu does not compile.
func testSources(file string) (Source, error) {
	switch file {
	case "split.cu":
		return Source{Name: file, Code: []byte(`extern "C" __global__ void a() { if constexpr (GPUKIT_KEEP(a)) {} }
extern "C" __global__ void b() { if constexpr (GPUKIT_KEEP(b)) {} }
extern "C" __global__ void c() { if constexpr (GPUKIT_KEEP(c)) {} }`)}, nil
	case "whole.cu":
		return Source{Name: file, Code: []byte(`extern "C" __global__ void w() {}`)}, nil
	case "bad.cu":
		return Source{Name: file, Code: []byte("#error broken\n")}, nil
	}
	return Source{}, ErrNoSource
}

// waitFor polls cond for up to 10 s (the workers are goroutines).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestPrefetcherCompilesOnlyWhatIsAsked(t *testing.T) {
	g := newGate()
	close(g.gate)
	p := newPrefetcher(NewCompiler(g, openTemp(t)), "sm_90a", 4, testSources)
	p.Prefetch("split.cu", "a", "c")
	p.Prefetch("whole.cu", "w")
	p.Prefetch("split.cu", "a") // again: no second compilation
	for _, u := range []Unit{{"split.cu", "a"}, {"split.cu", "c"}, {"whole.cu", ""}} {
		res, err := p.Get(u)
		if err != nil || len(res.Cubin) == 0 {
			t.Fatalf("Get(%v): %v", u, err)
		}
	}
	want := []string{"split.cu:a", "split.cu:c", "whole.cu"}
	if got := g.units(); !slices.Equal(got, want) {
		t.Fatalf("compiled %v, want %v (each once, b never)", got, want)
	}
	// The unit of a kernel of a file without GPUKIT_KEEP is the file.
	if u, err := p.Unit("whole.cu", "w"); err != nil || u != (Unit{File: "whole.cu"}) {
		t.Fatalf("Unit(whole.cu, w) = %v, %v", u, err)
	}
	if _, err := p.Unit("split.cu", "a -DX"); err == nil {
		t.Fatal("a kernel name with spaces was taken")
	}
}

func TestPrefetcherRunsWorkersAtOnce(t *testing.T) {
	const workers = 3
	g := newGate()
	p := newPrefetcher(NewCompiler(g, openTemp(t)), "sm_90a", workers, func(f string) (Source, error) {
		return Source{Name: f, Code: []byte("// " + f)}, nil
	})
	files := []string{"k0.cu", "k1.cu", "k2.cu", "k3.cu", "k4.cu", "k5.cu", "k6.cu"}
	for _, f := range files {
		p.Prefetch(f)
	}
	waitFor(t, "the workers to start", func() bool { return g.inflight.Load() == workers })
	time.Sleep(20 * time.Millisecond) // a fourth compilation would start now if the pool allowed it
	if n := g.inflight.Load(); n != workers {
		t.Fatalf("%d compilations at once, want %d (the pool's size)", n, workers)
	}
	close(g.gate)
	// The workers alone finish the queue; a Get before that could compile a
	// still-queued unit in its own goroutine (Get does not wait behind the
	// queue), a fourth compilation the pool did not start.
	waitFor(t, "the queue to drain", func() bool { return g.count() == len(files) && g.inflight.Load() == 0 })
	for _, f := range files {
		if _, err := p.Get(Unit{File: f}); err != nil {
			t.Fatal(err)
		}
	}
	if g.peak.Load() != workers || g.count() != len(files) {
		t.Fatalf("peak %d at once, %d compilations; want %d and %d", g.peak.Load(), g.count(), workers, len(files))
	}
}

func TestPrefetcherGetDoesNotWaitBehindTheQueue(t *testing.T) {
	g := newGate()
	g.open["split.cu:c"] = true
	p := newPrefetcher(NewCompiler(g, openTemp(t)), "sm_90a", 1, testSources)
	p.Prefetch("split.cu", "a", "b", "c") // the one worker blocks on a; b and c wait for it
	waitFor(t, "the worker to start", func() bool { return g.inflight.Load() == 1 })
	done := make(chan error, 1)
	go func() { _, err := p.Get(Unit{"split.cu", "c"}); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get of a queued unit waited for the queue ahead of it")
	}
	close(g.gate)
	for _, k := range []string{"a", "b"} {
		if _, err := p.Get(Unit{"split.cu", k}); err != nil {
			t.Fatal(err)
		}
	}
	// The queued worker for c found it claimed and did not compile it again.
	if got := g.units(); !slices.Equal(got, []string{"split.cu:a", "split.cu:b", "split.cu:c"}) {
		t.Fatalf("compiled %v", got)
	}
}

func TestPrefetcherUsesACachedWholeFile(t *testing.T) {
	g := newGate()
	close(g.gate)
	cache := openTemp(t)
	// kernelc build --libgpu: the whole file, into the cache.
	src, _ := testSources("split.cu")
	if _, err := NewCompiler(g, cache).Compile(src, EmbeddedOptions("sm_90a")); err != nil {
		t.Fatal(err)
	}
	p := newPrefetcher(NewCompiler(g, cache), "sm_90a", 2, testSources)
	u, err := p.Unit("split.cu", "b")
	if err != nil || u != (Unit{File: "split.cu"}) {
		t.Fatalf("Unit(split.cu, b) with the whole file cached = %v, %v; want the whole file", u, err)
	}
	p.Prefetch("split.cu", "a", "b")
	res, err := p.Get(u)
	if err != nil || !res.CacheHit || g.count() != 1 {
		t.Fatalf("Get: hit=%v err=%v, %d compilations (want the cached entry, no new compilation)", res.CacheHit, err, g.count())
	}
	// An instance compiled earlier is its own cache entry (GPUKIT_ONLY is in
	// the key): a new Prefetcher over a cache without the whole file
	// compiles the instance once, the next one hits it.
	g2 := newGate()
	close(g2.gate)
	cache2 := openTemp(t)
	for i := range 2 {
		p := newPrefetcher(NewCompiler(g2, cache2), "sm_90a", 2, testSources)
		res, err := p.Get(Unit{"split.cu", "a"})
		if err != nil || res.CacheHit != (i == 1) {
			t.Fatalf("process %d: hit=%v err=%v", i, res.CacheHit, err)
		}
	}
	if g2.count() != 1 {
		t.Fatalf("%d compilations of one instance in two processes, want 1", g2.count())
	}
}

func TestPrefetcherReportsErrorsOnGet(t *testing.T) {
	g := newGate()
	close(g.gate)
	p := newPrefetcher(NewCompiler(g, openTemp(t)), "sm_90a", 2, testSources)
	p.Prefetch("bad.cu")
	p.Prefetch("nosuch.cu") // ignored here
	_, err := p.Get(Unit{File: "bad.cu"})
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "broken") {
		t.Fatalf("Get(bad.cu): %v, want the compile error", err)
	}
	if _, err := p.Get(Unit{File: "nosuch.cu"}); !errors.Is(err, ErrNoSource) {
		t.Fatalf("Get(nosuch.cu): %v, want ErrNoSource", err)
	}
	// A failed unit is not compiled again by the same Prefetcher.
	n := g.count()
	if _, err := p.Get(Unit{File: "bad.cu"}); err == nil || g.count() != n {
		t.Fatalf("second Get(bad.cu): %v, %d compilations (was %d)", err, g.count(), n)
	}
}

func TestPrefetcherConcurrentGets(t *testing.T) {
	g := newGate()
	close(g.gate)
	p := newPrefetcher(NewCompiler(g, openTemp(t)), "sm_90a", 2, testSources)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Prefetch("split.cu", "a", "b")
			for _, k := range []string{"a", "b"} {
				if _, err := p.Get(Unit{"split.cu", k}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if got := g.units(); !slices.Equal(got, []string{"split.cu:a", "split.cu:b"}) {
		t.Fatalf("compiled %v, want each unit once", got)
	}
}

// TestEmbeddedSplittable: the big embedded files compile a kernel at a
// time, and every GPUKIT_KEEP names the kernel it sits in, so a
// GPUKIT_ONLY compilation keeps the kernel asked for.
func TestEmbeddedSplittable(t *testing.T) {
	for _, f := range []string{"attention.cu", "layernorm.cu"} {
		src, err := Embedded(f)
		if err != nil {
			t.Fatal(err)
		}
		if !Splittable(src.Code) {
			t.Errorf("%s does not mark its kernels with GPUKIT_KEEP", f)
		}
	}
	checked := 0
	for _, f := range Sources() {
		src, _ := Embedded(f)
		n, bad := keepMismatches(string(src.Code))
		checked += n
		for _, b := range bad {
			t.Errorf("%s: %s", f, b)
		}
	}
	if checked < 26+5 { // the kernel definitions written in attention.cu and layernorm.cu
		t.Errorf("checked %d GPUKIT_KEEP names, want at least 31", checked)
	}
	// The check sees a slip.
	slip := "#define I(S) \\\n  extern \"C\" __global__ void __launch_bounds__(F(1, 2)) \\\n  k_##S(int a) { \\\n  if constexpr (GPUKIT_KEEP(k_##T)) f(a); }"
	if _, bad := keepMismatches(slip); len(bad) != 1 {
		t.Errorf("a kernel keeping another name was not caught: %v", bad)
	}
}

// keepMismatches returns how many kernels of code have a GPUKIT_KEEP and
// those whose GPUKIT_KEEP names another kernel (a copy-paste slip that
// would compile an empty kernel for a run that launches it).
func keepMismatches(code string) (n int, bad []string) {
	code = strings.ReplaceAll(code, "\\\n", " ")
	defs := strings.Split(code, `extern "C"`)
	for _, d := range defs[1:] {
		brace := strings.IndexByte(d, '{')
		if brace < 0 {
			continue
		}
		head := d[:brace]
		open := strings.LastIndexByte(head, '(')
		// The parameter list's '(' is the last top-level one: back up over
		// a parenthesised list that closes right before the brace.
		depth := 0
		for i := len(head) - 1; i >= 0; i-- {
			if head[i] == ')' {
				depth++
			} else if head[i] == '(' {
				depth--
				if depth == 0 {
					open = i
					break
				}
			}
		}
		fields := strings.Fields(head[:open])
		if len(fields) == 0 {
			continue
		}
		name := fields[len(fields)-1]
		k := strings.Index(d, "GPUKIT_KEEP(")
		if k < 0 {
			continue
		}
		arg := d[k+len("GPUKIT_KEEP("):]
		arg = strings.TrimSpace(arg[:strings.IndexByte(arg, ')')])
		n++
		if arg != name {
			bad = append(bad, fmt.Sprintf("kernel %s keeps GPUKIT_KEEP(%s)", name, arg))
		}
	}
	return n, bad
}
