package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
)

// bins holds the gpupool and optimizer binaries: built once per test run
// (go build, in the workspace), or $GPUKIT_BIN's on the GPU machine, which
// has no Go toolchain.
var bins string

func binaries(t testing.TB) string {
	t.Helper()
	if bins != "" {
		return bins
	}
	if b := os.Getenv("GPUKIT_BIN"); b != "" {
		bins = b
		return b
	}
	dir, err := os.MkdirTemp("", "optimizer-e2e")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"gpukit/gpupool", "gpukit/optimizer"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, filepath.Base(pkg)), pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	bins = dir
	return dir
}

// daemon starts a tool's serve command and waits for the socket path it
// prints when ready; the process is killed at cleanup.
func daemon(t testing.TB, tool string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(filepath.Join(binaries(t), tool), args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan error, 1)
	go func() {
		_, err := bufio.NewReader(out).ReadString('\n')
		ready <- err
		io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%s serve: %v", tool, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s serve: not ready after 30s", tool)
	}
	return cmd
}

// stack is a pool daemon and an optimizer service on it.
type stack struct {
	pool, opt string
	optCmd    *exec.Cmd
}

func startStack(t *testing.T, backend string) *stack { return startStackTB(t, backend) }

func startStackTB(t testing.TB, backend string) *stack {
	dir := t.TempDir()
	s := &stack{pool: filepath.Join(dir, "pool.sock"), opt: filepath.Join(dir, "opt.sock")}
	daemon(t, "gpupool", "serve", "--socket", s.pool, "--backend", backend)
	s.optCmd = daemon(t, "optimizer", "serve", "--socket", s.opt, "--pool", s.pool, "--precision", "tf32")
	return s
}

var e2eShapes = [][]int{{33, 20}, {20}, {20, 12}}

// trainerSide is the test process as a trainer: parameters and gradients
// in named pool buffers, an engine on the pool's device.
type trainerSide struct {
	pc     *pool.Client
	book   *service.NameBook
	e      *ops.Engine
	params []nn.Param
}

func newTrainerSide(t *testing.T, poolSock, run string, seed uint64) *trainerSide {
	return newTrainerSideTB(t, poolSock, run, e2eShapes, seed)
}

func newTrainerSideTB(t testing.TB, poolSock, run string, shapes [][]int, seed ...uint64) *trainerSide {
	t.Helper()
	pc, err := pool.Dial(poolSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	e, err := ops.NewEngine(pc.Device(), ops.Options{Precision: ops.PrecTF32})
	if err != nil {
		t.Fatal(err)
	}
	ts := &trainerSide{pc: pc, book: service.NewNameBook(pc), e: e}
	r := rand.New(rand.NewPCG(append(seed, 1)[0], 1))
	for i, sh := range shapes {
		name := fmt.Sprintf("layer%d.weight", i)
		v, err := tensor.Alloc(ts.book, run+"/params/"+name, tensor.F32, sh...)
		if err != nil {
			t.Fatal(err)
		}
		g, err := tensor.Alloc(ts.book, run+"/grads/"+name, tensor.F32, sh...)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.WriteFloat32(randVec(r, v.Numel())); err != nil {
			t.Fatal(err)
		}
		ts.params = append(ts.params, nn.Param{Name: name, Value: v, Grad: g})
	}
	return ts
}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// step writes gradients and steps o.
func (ts *trainerSide) step(o optim.Optimizer, r *rand.Rand) error {
	if err := ts.e.Sync(); err != nil {
		return err
	}
	for _, p := range ts.params {
		if err := p.Grad.WriteFloat32(randVec(r, p.Grad.Numel())); err != nil {
			return err
		}
	}
	return o.Step(ts.e)
}

func (ts *trainerSide) values(t *testing.T) [][]float32 {
	t.Helper()
	if err := ts.e.Sync(); err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for _, p := range ts.params {
		v, err := p.Value.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func (ts *trainerSide) register(t *testing.T, sock, run string, s optim.Spec) *service.Remote {
	t.Helper()
	c, err := service.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Register(ts.e, service.Registration{Run: run, Spec: s, Params: ts.params, Buffers: ts.book, Mem: ts.pc})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func e2eSpec(t *testing.T, name string) optim.Spec {
	s, err := optim.Defaults(name)
	if err != nil {
		t.Fatal(err)
	}
	s.MaxBlock, s.UpdateFreq = 16, 3
	if name == "shampoo" || name == "soap" {
		s.Async, s.MaxStaleness = true, 1
	}
	return s
}

// released waits (up to 10 s: frees are messages the pool serves in its
// own time, not round trips) until the pool holds no buffer of the run's
// optimizer.
func released(t *testing.T, pc *pool.Client, run string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := optimNames(t, pc, run)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s later the pool still holds %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// optimNames in the pool: the buffers a run's optimizer holds.
func optimNames(t *testing.T, pc *pool.Client, run string) []string {
	t.Helper()
	bs, err := pc.Ls()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range bs {
		if strings.HasPrefix(b.Name, run+"/optim/") {
			out = append(out, b.Name)
		}
	}
	return out
}

func checkServiceMatchesInProcess(t *testing.T, backend string) {
	st := startStack(t, backend)
	for _, name := range []string{"shampoo", "soap", "muon", "adamw"} {
		t.Run(name, func(t *testing.T) {
			if backend == "cuda" {
				cudatest.RequireGPU(t)
			}
			local := newTrainerSide(t, st.pool, "local-"+name, 1)
			remote := newTrainerSide(t, st.pool, "remote-"+name, 1)
			lo, err := optim.New(local.book, "local-"+name, local.params, nil, e2eSpec(t, name))
			if err != nil {
				t.Fatal(err)
			}
			defer lo.Free()
			ro := remote.register(t, st.opt, "remote-"+name, e2eSpec(t, name))
			if got := optimNames(t, remote.pc, "remote-"+name); len(got) == 0 {
				t.Error("the run's state is not in the pool")
			}
			r1, r2 := rand.New(rand.NewPCG(3, 4)), rand.New(rand.NewPCG(3, 4))
			for i := 0; i < 6; i++ {
				if err := local.step(lo, r1); err != nil {
					t.Fatal(err)
				}
				if err := remote.step(ro, r2); err != nil {
					t.Fatal(err)
				}
			}
			a, b := local.values(t), remote.values(t)
			for i := range a {
				for k := range a[i] {
					if math.Float32bits(a[i][k]) != math.Float32bits(b[i][k]) {
						t.Fatalf("param %d [%d]: in process %v, service %v", i, k, a[i][k], b[i][k])
					}
				}
			}
			if err := ro.Free(); err != nil {
				t.Fatal(err)
			}
			released(t, remote.pc, "remote-"+name)
		})
	}
}

// TestServiceMatchesInProcess: optimizers run by `optimizer serve` over
// buffers of a real `gpupool serve` (host memory) give bitwise the
// parameters of the same optimizers in process, and Free releases the
// run's state from the pool.
func TestServiceMatchesInProcess(t *testing.T) { checkServiceMatchesInProcess(t, "host") }

// TestGPUServiceMatchesInProcess is TestServiceMatchesInProcess on a GPU
// pool: the service's steps, ordered with the trainer's stream by
// interprocess events, are bitwise the in-process ones (TF32).
func TestGPUServiceMatchesInProcess(t *testing.T) {
	cudatest.RequireGPU(t)
	checkServiceMatchesInProcess(t, "cuda")
}

// TestKillService: kill -9 of the service makes the trainer's next step
// fail with ErrGone; freeing the remote optimizer then leaves nothing of
// the run in the pool.
func TestKillService(t *testing.T) {
	st := startStack(t, "host")
	ts := newTrainerSide(t, st.pool, "run", 5)
	ro := ts.register(t, st.opt, "run", e2eSpec(t, "shampoo"))
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2; i++ {
		if err := ts.step(ro, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.optCmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st.optCmd.Wait()
	err := ts.step(ro, r)
	if !errors.Is(err, service.ErrGone) {
		t.Fatalf("step after kill -9 of the service: %v, want ErrGone", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q is more than one line", err)
	}
	ro.Free()
	released(t, ts.pc, "run")
}

// envRole makes the test binary a child trainer (TestKillTrainer).
const envRole = "GPUKIT_OPTIMIZER_TEST_TRAINER"

// TestKillTrainer: kill -9 of a trainer makes the service release the
// run (its state leaves the pool) and keep serving: the run's name can be
// registered again.
func TestKillTrainer(t *testing.T) {
	if os.Getenv(envRole) != "" {
		childTrainer(t)
		return
	}
	st := startStack(t, "host")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillTrainer$")
	cmd.Env = append(os.Environ(), envRole+"=1", "CHILD_POOL="+st.pool, "CHILD_OPT="+st.opt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "stepping" {
		t.Fatalf("child: %q, %v", line, err)
	}
	pc, err := pool.Dial(st.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if len(optimNames(t, pc, "run")) == 0 {
		t.Fatal("the child's run holds no state in the pool")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	released(t, pc, "run")
	ts := newTrainerSide(t, st.pool, "run", 6)
	ro := ts.register(t, st.opt, "run", e2eSpec(t, "soap"))
	if err := ts.step(ro, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatalf("step on the service after the kill: %v", err)
	}
	ro.Free()
}

// childTrainer registers a run, steps, says so, and steps until killed.
func childTrainer(t *testing.T) {
	ts := newTrainerSide(t, os.Getenv("CHILD_POOL"), "run", 7)
	ro := ts.register(t, os.Getenv("CHILD_OPT"), "run", e2eSpec(t, "shampoo"))
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; ; i++ {
		if err := ts.step(ro, r); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			fmt.Println("stepping")
		}
		time.Sleep(time.Millisecond)
	}
}

// benchService times one step through the service on a pool of backend:
// a tiny SGD step (one 16×16 parameter), so the time is the round trip —
// the client's event record, the message and reply, the service's wait,
// kernel launch and event record, the client's stream wait — against the
// same step in process. Reports the medians and the 99th percentiles in µs
// and their difference, the overhead per step, three ways:
//
//   - back to back (service_p50_us, inprocess_p50_us, overhead_p50_us,
//     service_p99_us): b.N steps with no wait between them. Nothing here
//     waits for the GPU, so once the GPU falls behind (on a GPU pool each
//     step is a chain the GPU runs in order across two processes' contexts:
//     the client's record, the service's wait, kernel and record, the
//     client's wait) the launch queues fill and a step's time becomes the
//     GPU's time per step, not the host's;
//   - idle (*_idle_p50_us, overhead_idle_p50_us): each step timed alone
//     with the GPU idle (the engine synchronised before it, outside the
//     timer): the host's round trip, what a trainer whose step takes
//     milliseconds of GPU work pays per message;
//   - synced (*_sync_p50_us, overhead_sync_p50_us): a step and the
//     engine's synchronisation, from an idle GPU: the latency of the step's
//     GPU work ordered through the interprocess events, against the same
//     kernel in process.
//
// On the host backend the three agree (there is no GPU work to wait for).
func benchService(b *testing.B, backend string) {
	st := startStackTB(b, backend)
	ts := newTrainerSideTB(b, st.pool, "bench", [][]int{{16, 16}}, 1)
	spec, _ := optim.Defaults("sgd")
	spec.LR = 0
	c, err := service.Dial(st.opt)
	if err != nil {
		b.Fatal(err)
	}
	ro, err := c.Register(ts.e, service.Registration{Run: "bench", Spec: spec, Params: ts.params, Buffers: ts.book, Mem: ts.pc})
	if err != nil {
		b.Fatal(err)
	}
	defer ro.Free()
	lo, err := optim.New(ts.book, "bench-local", ts.params, nil, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer lo.Free()
	sync := func() {
		if err := ts.e.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	step := func(o optim.Optimizer) {
		if err := o.Step(ts.e); err != nil {
			b.Fatal(err)
		}
	}
	// mode 0: back to back; 1: idle; 2: synced.
	measure := func(o optim.Optimizer, mode int) []float64 {
		for i := 0; i < 50; i++ { // warm-up: kernels, spinning
			step(o)
		}
		sync()
		us := make([]float64, 0, b.N)
		for i := 0; i < b.N; i++ {
			if mode != 0 {
				sync()
			}
			t0 := time.Now()
			step(o)
			if mode == 2 {
				sync()
			}
			us = append(us, float64(time.Since(t0).Nanoseconds())/1e3)
		}
		sync()
		sort.Float64s(us)
		return us
	}
	q := func(v []float64, p float64) float64 { return v[int(p*float64(len(v)-1))] }
	b.ResetTimer()
	remote, local := measure(ro, 0), measure(lo, 0)
	remoteIdle, localIdle := measure(ro, 1), measure(lo, 1)
	remoteSync, localSync := measure(ro, 2), measure(lo, 2)
	b.StopTimer()
	b.ReportMetric(q(remote, 0.5), "service_p50_us")
	b.ReportMetric(q(remote, 0.99), "service_p99_us")
	b.ReportMetric(q(local, 0.5), "inprocess_p50_us")
	b.ReportMetric(q(remote, 0.5)-q(local, 0.5), "overhead_p50_us")
	b.ReportMetric(q(remoteIdle, 0.5), "service_idle_p50_us")
	b.ReportMetric(q(remoteIdle, 0.99), "service_idle_p99_us")
	b.ReportMetric(q(localIdle, 0.5), "inprocess_idle_p50_us")
	b.ReportMetric(q(remoteIdle, 0.5)-q(localIdle, 0.5), "overhead_idle_p50_us")
	b.ReportMetric(q(remoteSync, 0.5), "service_sync_p50_us")
	b.ReportMetric(q(localSync, 0.5), "inprocess_sync_p50_us")
	b.ReportMetric(q(remoteSync, 0.5)-q(localSync, 0.5), "overhead_sync_p50_us")
}

// BenchmarkServiceStepHost: the service's round trip on a host pool.
func BenchmarkServiceStepHost(b *testing.B) { benchService(b, "host") }

// BenchmarkServiceStepGPU: the round trip on a GPU pool (interprocess
// events on both streams); the target is an overhead p50 ≤ 30 µs.
func BenchmarkServiceStepGPU(b *testing.B) {
	cudatest.RequireGPU(b)
	benchService(b, "cuda")
}
