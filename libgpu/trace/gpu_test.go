package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/trace/cudaev"
)

// GPU tests: cudatest.RequireGPU skips them without a GPU and fails them when
// GPUKIT_REQUIRE_GPU=1 (the GPU machine).

const spinSrc = `
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
`

// spinKernel compiles a kernel that busy-waits for a number of SM clock cycles.
func spinKernel(t *testing.T) cuda.Function {
	t.Helper()
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ma, mi, err := d.ComputeCapability()
	if err != nil {
		t.Fatal(err)
	}
	arch := fmt.Sprintf("--gpu-architecture=sm_%d%d", ma, mi)
	if ma >= 9 {
		arch += "a"
	}
	p, err := cuda.CreateProgram(spinSrc, "spin.cu", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy()
	if err := p.Compile([]string{arch}); err != nil {
		log, _ := p.Log()
		t.Fatalf("%v\n%s", err, log)
	}
	img, err := p.CUBIN()
	if err != nil {
		t.Fatal(err)
	}
	m, err := cuda.ModuleLoadData(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unload() })
	f, err := m.Function("spin")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func launchSpin(t *testing.T, f cuda.Function, s cuda.Stream, cycles int64) {
	t.Helper()
	if err := cuda.LaunchKernel(f, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, s, unsafe.Pointer(&cycles)); err != nil {
		t.Fatal(err)
	}
}

// gpuCheck runs n regions on a stream, each timed both by a GPUTimer span and
// by a plain pair of CUDA events recorded just outside it, and compares.
// region queues the region's work; graph says what the region is.
func gpuCheck(t *testing.T, n int, region func(i int, s cuda.Stream)) {
	t.Helper()
	snk := newSink(t)
	tr := Open(snk.path, "gpu-test", Options{})
	defer tr.Close()
	s, err := cuda.StreamCreate(true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	g, err := NewGPUTimer(tr, cudaev.New(cudatest.Context(), s), "test stream")
	if err != nil {
		t.Fatal(err)
	}
	plain := make([][2]cuda.Event, n)
	hosts := make([]int64, n)
	for i := range plain {
		for j := range plain[i] {
			if plain[i][j], err = cuda.EventCreate(cuda.EventDefault); err != nil {
				t.Fatal(err)
			}
			defer plain[i][j].Destroy()
		}
	}
	for i := 0; i < n; i++ {
		if err := plain[i][0].Record(s); err != nil {
			t.Fatal(err)
		}
		hosts[i] = tr.Now()
		sp := g.Begin(CategoryGPU, "region")
		sp.Arg(Int("i", int64(i)))
		region(i, s)
		sp.End()
		if err := plain[i][1].Record(s); err != nil {
			t.Fatal(err)
		}
		if i%3 == 2 { // let the stream drain now and then, as a step's loss readback does
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	var spans []Record
	deadline := time.Now().Add(10 * time.Second)
	for len(spans) < n && time.Now().Before(deadline) {
		spans = spans[:0]
		for _, r := range snk.records() {
			if r.Kind == KindSpan && r.Cat == CategoryGPU && r.Track == g.track.id {
				spans = append(spans, r)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(spans) != n {
		t.Fatalf("%d GPU spans, want %d (stats %+v)", len(spans), n, tr.Stats())
	}
	var worst float64
	for i, sp := range spans {
		if sp.Args[0].Int != int64(i) || sp.Name != "region" {
			t.Fatalf("span %d is %+v", i, sp)
		}
		ms, err := cuda.EventElapsed(plain[i][0], plain[i][1])
		if err != nil {
			t.Fatal(err)
		}
		want := float64(ms) * 1e6
		got := float64(sp.Dur)
		// The plain pair encloses the span's pair: it is at least as long, and
		// longer only by two event records. On an idle stream that is up to a
		// launch's latency (the first region measured 6.6 µs longer on an
		// H200), so allow 10 µs plus 1%.
		if got > want+1000 || got < want-10000-0.01*want {
			t.Errorf("region %d: GPU span %.1f µs, plain events %.1f µs", i, got/1e3, want/1e3)
		}
		worst = math.Max(worst, math.Abs(got-want))
		if sp.Start < hosts[i] {
			t.Errorf("region %d starts %d ns before it was recorded", i, hosts[i]-sp.Start)
		}
		if i > 0 && sp.Start < spans[i-1].Start+spans[i-1].Dur {
			t.Errorf("region %d starts %d ns before region %d ended", i, spans[i-1].Start+spans[i-1].Dur-sp.Start, i-1)
		}
	}
	if !strings.HasPrefix(g.track.t.names[len(g.track.t.names)-1].Name, "GPU: ") {
		t.Errorf("GPU track named %q", g.track.t.names[len(g.track.t.names)-1].Name)
	}
	t.Logf("%d regions: largest |span - plain events| = %.2f µs", n, worst/1e3)
}

// TestGPUEagerSpansMatchEvents: one span per eager op (a kernel launch),
// of the duration a plain CUDA-event pair measures.
func TestGPUEagerSpansMatchEvents(t *testing.T) {
	cudatest.RequireGPU(t)
	f := spinKernel(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	cycles := make([]int64, 30)
	for i := range cycles {
		cycles[i] = 20_000 + r.Int64N(2_000_000)
	}
	gpuCheck(t, len(cycles), func(i int, s cuda.Stream) { launchSpin(t, f, s, cycles[i]) })
}

// TestGPUGraphReplaySpansMatchEvents: one span per graph replay.
func TestGPUGraphReplaySpansMatchEvents(t *testing.T) {
	cudatest.RequireGPU(t)
	f := spinKernel(t)
	s, err := cuda.StreamCreate(true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := s.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for k := 0; k < 5; k++ {
		launchSpin(t, f, s, 50_000+r.Int64N(400_000))
	}
	graph, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Destroy()
	exec, err := graph.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Destroy()
	gpuCheck(t, 20, func(i int, s cuda.Stream) {
		if err := exec.Launch(s); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGPUTimerDropsWhenFull: more regions in flight than event pairs are
// dropped and counted, never waited for.
func TestGPUTimerDropsWhenFull(t *testing.T) {
	cudatest.RequireGPU(t)
	f := spinKernel(t)
	snk := newSink(t)
	tr := Open(snk.path, "gpu-full", Options{})
	defer tr.Close()
	s, err := cuda.StreamCreate(true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	g, err := NewGPUTimer(tr, cudaev.New(cudatest.Context(), s), "full")
	if err != nil {
		t.Fatal(err)
	}
	// The first region holds the stream for ~100 ms at ~2 GHz; all the rest queue behind it.
	extra := 10 + rand.IntN(20)
	for i := 0; i < DefaultGPUSlots+extra; i++ {
		sp := g.Begin(CategoryGPU, "r")
		if i == 0 {
			launchSpin(t, f, s, 200_000_000)
		}
		sp.End()
	}
	dropped := tr.Stats().Dropped
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() { sp := g.Begin(CategoryGPU, "r"); sp.End() })
	t.Logf("allocations per GPU region: %v", allocs)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	// Slots in flight are DefaultGPUSlots-1 (one is the poller's anchor).
	if want := uint64(extra + 1); dropped != want {
		t.Fatalf("dropped %d regions, want %d", dropped, want)
	}
}
