package server_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/tensor"
	"gpukit/optimizer/internal/server"
)

// memory is an in-process stand-in for the pool (both sides of the
// protocol run in the test process and share host memory): named
// allocations that Open maps again, and a count of live allocations.
type memory struct {
	dev   *device.Host
	mu    sync.Mutex
	named map[string]*device.Buffer
	live  int
}

func newMemory() *memory { return &memory{dev: device.NewHost(), named: map[string]*device.Buffer{}} }

func (m *memory) Device() device.Device { return m.dev }

func (m *memory) Alloc(name string, size int64) (*device.Buffer, error) {
	b, err := m.dev.Alloc(size)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if name != "" {
		if _, dup := m.named[name]; dup {
			b.Free()
			return nil, fmt.Errorf("name %q taken", name)
		}
		m.named[name] = b
	}
	m.live++
	return device.NewBuffer(m.dev, b.Ptr(), b.Size(), b.Bytes(), b.Share(), func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.live--
		if name != "" {
			delete(m.named, name)
		}
		return b.Free()
	}), nil
}

func (m *memory) Open(name string) (*device.Buffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.named[name]
	if !ok {
		return nil, fmt.Errorf("no buffer %q", name)
	}
	return device.NewBuffer(m.dev, b.Ptr(), b.Size(), b.Bytes(), b.Share(), nil), nil
}

func (m *memory) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live
}

func (m *memory) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.named[name]; !ok {
		return fmt.Errorf("no buffer %q", name)
	}
	delete(m.named, name)
	return nil
}

// Handover stands for a new pool connection: one end of a socketpair.
func (m *memory) Handover() (*os.File, error) {
	a, b, err := ipc.Pair()
	if err != nil {
		return nil, err
	}
	defer a.Close()
	defer b.Close()
	return a.File()
}

// Path, Adopt: memory is the service's Pools too; a run's Memory is a view
// that frees what the run allocated through it when it closes, as the
// pool does at the end of a connection.
func (m *memory) Path() string { return "test" }

func (m *memory) Adopt(fd int, _ ipc.Cred) (server.Memory, error) {
	unix.Close(fd)
	return &runMemory{memory: m, held: map[*device.Buffer]bool{}}, nil
}

type runMemory struct {
	*memory
	mu   sync.Mutex
	held map[*device.Buffer]bool
}

func (r *runMemory) Alloc(name string, size int64) (*device.Buffer, error) {
	b, err := r.memory.Alloc(name, size)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.held[b] = true
	r.mu.Unlock()
	return device.NewBuffer(b.Device(), b.Ptr(), b.Size(), b.Bytes(), b.Share(), func() error {
		r.mu.Lock()
		held := r.held[b]
		delete(r.held, b)
		r.mu.Unlock()
		if held {
			return b.Free()
		}
		return nil
	}), nil
}

func (r *runMemory) Close() error {
	r.mu.Lock()
	held := r.held
	r.held = map[*device.Buffer]bool{}
	r.mu.Unlock()
	for b := range held {
		b.Free()
	}
	return nil
}

// serve starts a service over mem on a temporary socket.
func serve(t *testing.T, mem *memory) (string, *ipc.Server) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "optimizer.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &ipc.Server{Handler: &server.Server{Pool: mem, Admission: ipc.Admission{Self: uint32(os.Geteuid())}}}
	go srv.Serve(l)
	t.Cleanup(srv.Shutdown)
	return path, srv
}

var shapes = [][]int{{7, 5}, {5}, {4, 6}}

// model is a client's parameters in named buffers.
type model struct {
	e      *ops.Engine
	book   *service.NameBook
	params []nn.Param
}

func newModel(t *testing.T, mem *memory, run string, seed uint64) *model {
	t.Helper()
	e, err := ops.NewEngine(mem.dev, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{e: e, book: service.NewNameBook(mem)}
	r := rand.New(rand.NewPCG(seed, 1))
	for i, sh := range shapes {
		name := fmt.Sprintf("layer%d.weight", i)
		v, err := tensor.Alloc(m.book, run+"/params/"+name, tensor.F32, sh...)
		if err != nil {
			t.Fatal(err)
		}
		g, err := tensor.Alloc(m.book, run+"/grads/"+name, tensor.F32, sh...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.Buf.Free(); g.Buf.Free() })
		v.WriteFloat32(randVec(r, v.Numel()))
		m.params = append(m.params, nn.Param{Name: name, Value: v, Grad: g})
	}
	return m
}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func (m *model) step(t *testing.T, o optim.Optimizer, r *rand.Rand) {
	t.Helper()
	for _, p := range m.params {
		if err := p.Grad.WriteFloat32(randVec(r, p.Grad.Numel())); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Step(m.e); err != nil {
		t.Fatal(err)
	}
}

func (m *model) values(t *testing.T) [][]float32 {
	var out [][]float32
	for _, p := range m.params {
		v, err := p.Value.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func same(t *testing.T, what string, a, b [][]float32) {
	t.Helper()
	for i := range a {
		for k := range a[i] {
			if math.Float32bits(a[i][k]) != math.Float32bits(b[i][k]) {
				t.Fatalf("%s: param %d [%d]: %v vs %v", what, i, k, a[i][k], b[i][k])
			}
		}
	}
}

func spec(t *testing.T, name string) optim.Spec {
	s, err := optim.Defaults(name)
	if err != nil {
		t.Fatal(err)
	}
	s.MaxBlock, s.UpdateFreq = 3, 2
	return s
}

func register(t *testing.T, path string, m *model, mem *memory, run string, s optim.Spec) *service.Remote {
	t.Helper()
	c, err := service.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Register(m.e, service.Registration{Run: run, Spec: s, Params: m.params, Buffers: m.book, Mem: mem})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestServiceMatchesInProcess: each optimizer run through the service
// gives bitwise the parameters of the same optimizer in process; the run's
// state is released when it is freed.
func TestServiceMatchesInProcess(t *testing.T) {
	for _, name := range []string{"adamw", "shampoo", "soap", "muon"} {
		t.Run(name, func(t *testing.T) {
			mem := newMemory()
			path, _ := serve(t, mem)
			before := mem.liveCount()
			local := newModel(t, mem, "local", 1)
			remote := newModel(t, mem, "remote", 1)
			lo, err := optim.New(local.book, "local", local.params, nil, spec(t, name))
			if err != nil {
				t.Fatal(err)
			}
			defer lo.Free()
			ro := register(t, path, remote, mem, "remote", spec(t, name))
			r1, r2 := rand.New(rand.NewPCG(5, 6)), rand.New(rand.NewPCG(5, 6))
			for i := 0; i < 5; i++ {
				local.step(t, lo, r1)
				remote.step(t, ro, r2)
				same(t, fmt.Sprintf("step %d", i+1), local.values(t), remote.values(t))
			}
			if len(ro.State()) != len(lo.State()) {
				t.Errorf("remote state %d tensors, local %d", len(ro.State()), len(lo.State()))
			}
			if err := ro.Free(); err != nil {
				t.Fatal(err)
			}
			lo.Free()
			// What is left: the two models' parameters and gradients.
			if got, want := mem.liveCount(), before+4*len(shapes); got != want {
				t.Errorf("%d allocations live after Free, want %d", got, want)
			}
		})
	}
}

// TestServiceResume: a run's state read through the service (a
// checkpoint) and written into a new run's state before its first step
// continues bitwise as the uninterrupted run.
func TestServiceResume(t *testing.T) {
	mem := newMemory()
	path, _ := serve(t, mem)
	s := spec(t, "shampoo")
	s.Async, s.MaxStaleness = true, 1
	want := newModel(t, mem, "a", 2)
	wo := register(t, path, want, mem, "a", s)
	defer wo.Free()
	got := newModel(t, mem, "b", 2)
	bo := register(t, path, got, mem, "b", s)
	r1, r2 := rand.New(rand.NewPCG(7, 8)), rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 3; i++ {
		want.step(t, wo, r1)
		got.step(t, bo, r2)
	}
	saved := map[string][]byte{}
	for _, st := range bo.State() {
		b, err := st.Value.Read()
		if err != nil {
			t.Fatal(err)
		}
		saved[st.Name] = b
	}
	if err := bo.Free(); err != nil {
		t.Fatal(err)
	}
	bo = register(t, path, got, mem, "b", s)
	defer bo.Free()
	for _, st := range bo.State() {
		if err := st.Value.Write(saved[st.Name]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		want.step(t, wo, r1)
		got.step(t, bo, r2)
	}
	same(t, "resumed", want.values(t), got.values(t))
}

// TestServiceErrors: errors cross the socket as their sentinels, and the
// connection stays usable after each.
func TestServiceErrors(t *testing.T) {
	mem := newMemory()
	path, srv := serve(t, mem)
	m := newModel(t, mem, "run", 3)
	c, err := service.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := spec(t, "shampoo")
	bad.UpdateFreq = 0
	if _, err := c.Register(m.e, service.Registration{Run: "run", Spec: bad, Params: m.params, Buffers: m.book, Mem: mem}); !errors.Is(err, optim.ErrConfig) {
		t.Errorf("bad spec: %v, want optim.ErrConfig", err)
	}
	other := service.NewNameBook(mem)
	if _, err := c.Register(m.e, service.Registration{Run: "run", Spec: spec(t, "sgd"), Params: m.params, Buffers: other, Mem: mem}); !errors.Is(err, service.ErrTensor) {
		t.Errorf("unnamed tensors: %v, want ErrTensor", err)
	}
	r, err := c.Register(m.e, service.Registration{Run: "run", Spec: spec(t, "sgd"), Params: m.params, Buffers: m.book, Mem: mem})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(m.e, service.Registration{Run: "run2", Spec: spec(t, "sgd"), Params: m.params, Buffers: m.book, Mem: mem}); !errors.Is(err, service.ErrRegistered) {
		t.Errorf("second register: %v, want ErrRegistered", err)
	}
	c2, err := service.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Register(m.e, service.Registration{Run: "run", Spec: spec(t, "sgd"), Params: m.params, Buffers: m.book, Mem: mem}); !errors.Is(err, service.ErrRunInUse) {
		t.Errorf("run name in use: %v, want ErrRunInUse", err)
	}
	c2.Close()
	if err := r.Step(m.e); err != nil {
		t.Fatalf("step after errors: %v", err)
	}
	// The service goes away: the next step says so.
	srv.Shutdown()
	if err := r.Step(m.e); !errors.Is(err, service.ErrGone) {
		t.Errorf("step after shutdown: %v, want ErrGone", err)
	}
	r.Free()
}

// TestServiceLRScale: a registration's learning-rate scale (a named f32
// the client rewrites, a schedule) is read by the service's Muon as by the
// same Muon in process: bitwise equal parameters under a changing scale.
func TestServiceLRScale(t *testing.T) {
	mem := newMemory()
	path, _ := serve(t, mem)
	local := newModel(t, mem, "local", 4)
	remote := newModel(t, mem, "remote", 4)
	scale := func(m *model, run string) *tensor.Tensor {
		s, err := tensor.Alloc(m.book, run+"/acts/lr_scale", tensor.F32, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Buf.Free() })
		return s
	}
	ls, rs := scale(local, "local"), scale(remote, "remote")
	lo, err := optim.New(local.book, "local", local.params, nil, spec(t, "muon"))
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Free()
	lo.(*optim.Muon).SetLRScale(ls)
	c, err := service.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := c.Register(remote.e, service.Registration{Run: "remote", Spec: spec(t, "muon"), Params: remote.params,
		Buffers: remote.book, Mem: mem, LRScale: rs})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Free()
	if !ro.LRScaled() {
		t.Fatal("the service's Muon does not read the scale")
	}
	r1, r2 := rand.New(rand.NewPCG(9, 9)), rand.New(rand.NewPCG(9, 9))
	for i, f := range []float32{1, 0.5, 0.25, 0.1} {
		ls.WriteFloat32([]float32{f})
		rs.WriteFloat32([]float32{f})
		local.step(t, lo, r1)
		remote.step(t, ro, r2)
		same(t, fmt.Sprintf("step %d", i+1), local.values(t), remote.values(t))
	}
}
