package main

// Issue 22: the optimizer service held to gpupool's bar. Each test drives
// real `gpupool serve` and `optimizer serve` processes (host backend) as
// a hostile or unlucky client would.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ipc/ipctest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/pool"
)

// raw is a client of the service written against the protocol, not the Go
// client: it sends bodies as maps (float64 numbers, as Python's msgpack
// does) and hands over a connection to the pool made by pc.
type raw struct {
	c  *ipc.Client
	pc *pool.Client
}

func dialRaw(t *testing.T, sock string, pc *pool.Client) *raw {
	t.Helper()
	conn, err := ipc.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	c := ipc.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	return &raw{c: c, pc: pc}
}

func (r *raw) call(op string, body any, reply any, fds ...int) error {
	_, err := r.c.Call(context.Background(), op, body, reply, fds...)
	return err
}

// register sends a register with a fresh pool connection of r.pc.
func (r *raw) register(t *testing.T, body map[string]any) error {
	t.Helper()
	f, err := r.pc.Handover()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reply map[string]any
	return r.call(service.OpRegister, body, &reply, int(f.Fd()))
}

func tensorMap(buffer string, shape ...any) map[string]any {
	return map[string]any{"buffer": buffer, "dtype": "f32", "shape": shape}
}

func registerMap(run, opt string, value, grad map[string]any) map[string]any {
	return map[string]any{
		"run":    run,
		"spec":   map[string]any{"name": opt, "lr": 0.001, "max_block": 8},
		"params": []any{map[string]any{"name": "w", "value": value, "grad": grad}},
	}
}

func poolStats(t *testing.T, pc *pool.Client) pool.Stats {
	t.Helper()
	s, err := pc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitPool waits up to 10 s for the pool's stats to satisfy ok.
func waitPool(t *testing.T, pc *pool.Client, what string, ok func(pool.Stats) bool) pool.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := poolStats(t, pc)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s later, %s: %+v", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func serviceStats(t *testing.T, sock string) service.StatsReply {
	t.Helper()
	r := dialRaw(t, sock, nil)
	var s service.StatsReply
	if err := r.call(service.OpStats, nil, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Items 1 and 2: shapes and offsets that overflow, over a 16 KiB buffer,
// for every optimizer: each register is refused with optimizer.bad_tensor
// naming the field, its pool connection's leases go back at once, and the
// service goes on serving.
func TestOverflowRefused(t *testing.T) {
	st := startStack(t, "host")
	pc, err := pool.Dial(st.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for _, n := range []string{"v/params/w", "v/grads/w"} {
		if _, err := pc.Alloc(n, 16<<10); err != nil {
			t.Fatal(err)
		}
	}
	base := poolStats(t, pc)
	big := uint64(1) << 32
	cases := map[string]func(v map[string]any){
		"shape [2^32, 2^32]": func(v map[string]any) { v["shape"] = []any{big, big} },
		"offset 2^62":        func(v map[string]any) { v["offset"] = uint64(1) << 62 },
		"offset 3·2^61":      func(v map[string]any) { v["offset"] = uint64(3) << 61 },
		"offset 2^63-1":      func(v map[string]any) { v["offset"] = uint64(math.MaxInt64) },
		"past the buffer":    func(v map[string]any) { v["shape"] = []any{64, 65} },
		"offset past it":     func(v map[string]any) { v["offset"] = 4096 },
	}
	r := dialRaw(t, st.opt, pc)
	for _, opt := range []string{"sgd", "adamw", "muon", "shampoo", "soap"} {
		for name, edit := range cases {
			v := tensorMap("v/params/w", 64, 64)
			edit(v)
			err := r.register(t, registerMap("ov", opt, v, tensorMap("v/grads/w", 64, 64)))
			if !errors.Is(err, service.ErrTensor) || !strings.Contains(err.Error(), "params[0]") {
				t.Errorf("%s, %s: %v, want optimizer.bad_tensor naming params[0]", opt, name, err)
			}
		}
	}
	// Every refused run's pool connection was closed: no lease is left.
	waitPool(t, pc, "the refused runs' leases are back", func(s pool.Stats) bool {
		return s.Clients == base.Clients && s.Allocations == base.Allocations
	})
	// The service serves on: a good register on the same connection.
	if err := r.register(t, registerMap("ov", "shampoo", tensorMap("v/params/w", 64, 64), tensorMap("v/grads/w", 64, 64))); err != nil {
		t.Fatalf("a good register after the refusals: %v", err)
	}
	var step service.StepReply
	if err := r.call(service.OpStep, map[string]any{"lr": 0.01}, &step); err != nil || step.Step != 1 {
		t.Fatalf("step: %+v %v", step, err)
	}
	if s := serviceStats(t, st.opt); s.Runs != 1 || s.MaxConns <= 0 || s.FDLimit == 0 || s.MaxMessage != ipc.MaxMessage || s.MaxOrder != optim.MaxOrder {
		t.Fatalf("stats: %+v", s)
	}
}

// Item 7: bad settings and parameters are refused at register with the
// field named (not "internal" at the first step); float64 settings are
// taken; a missing or unsealed buffer is optimizer.bad_tensor.
func TestRegisterRefusesBadSettings(t *testing.T) {
	st := startStack(t, "host")
	pc, err := pool.Dial(st.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for name, size := range map[string]int64{"b/params/w": 4 * 16, "b/grads/w": 4 * 16, "b/grads/w2": 4 * 12,
		"b/params/fc.weight": 4 * 15, "b/grads/fc.weight": 4 * 15, "b/acts/in": 4 * 8 * 4, "b/acts/og": 4 * 8 * 5} {
		if _, err := pc.Alloc(name, size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.Create("b/params/unsealed", 64, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	good := func() map[string]any {
		return registerMap("bad", "adamw", tensorMap("b/params/w", 4, 4), tensorMap("b/grads/w", 4, 4))
	}
	setSpec := func(k string, v any) map[string]any {
		m := good()
		m["spec"].(map[string]any)[k] = v
		return m
	}
	param := func(edit func(p map[string]any)) map[string]any {
		m := good()
		edit(m["params"].([]any)[0].(map[string]any))
		return m
	}
	r := dialRaw(t, st.opt, pc)
	cases := []struct {
		what, field string
		want        error
		body        map[string]any
	}{
		{"lr NaN", "lr", optim.ErrConfig, setSpec("lr", math.NaN())},
		{"lr -1", "lr", optim.ErrConfig, setSpec("lr", -1.0)},
		{"beta1 1.5", "beta1", optim.ErrConfig, setSpec("beta1", 1.5)},
		{"bf16 params", "bf16", optim.ErrParams, param(func(p map[string]any) {
			p["value"].(map[string]any)["dtype"] = "bf16"
			p["grad"].(map[string]any)["dtype"] = "bf16"
		})},
		{"i32 params", "i32", optim.ErrParams, param(func(p map[string]any) {
			p["value"].(map[string]any)["dtype"] = "i32"
			p["grad"].(map[string]any)["dtype"] = "i32"
		})},
		{"mismatched shapes", `"w"`, optim.ErrParams, param(func(p map[string]any) { p["grad"] = tensorMap("b/grads/w2", 3, 4) })},
		{"empty name", "params[0].name", ipc.ErrBadRequest, param(func(p map[string]any) { p["name"] = "" })},
		{"missing buffer", "b/params/none", service.ErrTensor, param(func(p map[string]any) { p["value"] = tensorMap("b/params/none", 4, 4) })},
		{"unsealed buffer", "b/params/unsealed", service.ErrTensor, param(func(p map[string]any) { p["value"] = tensorMap("b/params/unsealed", 4, 4) })},
		{"K-FAC layer of the wrong width", "fc.weight", optim.ErrParams, map[string]any{
			"run":    "bad",
			"spec":   map[string]any{"name": "kfac"},
			"params": []any{map[string]any{"name": "fc.weight", "value": tensorMap("b/params/fc.weight", 5, 3), "grad": tensorMap("b/grads/fc.weight", 5, 3)}},
			"layers": []any{map[string]any{"weight": "fc.weight", "input": tensorMap("b/acts/in", 8, 4), "out_grad": tensorMap("b/acts/og", 8, 5)}},
		}},
	}
	for _, c := range cases {
		err := r.register(t, c.body)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want %v naming %s", c.what, err, c.want, c.field)
		}
	}
	// float64 settings (as this raw client sends them) are taken, and the
	// run steps.
	if err := r.register(t, setSpec("weight_decay", 0.0)); err != nil {
		t.Fatalf("float64 settings: %v", err)
	}
	if err := r.call(service.OpStep, map[string]any{"lr": 0.002}, &service.StepReply{}); err != nil {
		t.Fatal(err)
	}
}

// Item 3: a second uid. The service admits its own uid and root by
// default; a uid let in with --allow-uid acts on the pool only through its
// own pool connection, so under gpupool --isolate it cannot reach root's
// buffers through the service, and its run names are its own. As root the
// second uid is nobody (a child process); without root only the refusal
// of an unlisted peer is checked.
func TestSecondUID(t *testing.T) {
	if os.Getenv(envRole) == "nobody" {
		nobodyClient()
		return
	}
	// Abstract sockets: no file modes, only the daemons' checks.
	tag := fmt.Sprintf("%d-%d", os.Getpid(), rand.Uint32())
	poolSock, optSock, closedSock := "@gpukit-test-pool-"+tag, "@gpukit-test-opt-"+tag, "@gpukit-test-opt2-"+tag
	daemon(t, "gpupool", "serve", "--socket", poolSock, "--backend", "host", "--isolate")
	daemon(t, "optimizer", "serve", "--socket", optSock, "--pool", poolSock, "--allow-uid", fmt.Sprint(ipctest.Nobody))
	daemon(t, "optimizer", "serve", "--socket", closedSock, "--pool", poolSock)
	ts := newTrainerSide(t, poolSock, "root", 3)
	before := ts.values(t)
	ro := ts.register(t, optSock, "root", e2eSpec(t, "sgd"))
	defer ro.Free()
	if !ipctest.Root() {
		// This uid is the service's own: admitted. The refusal needs a
		// second uid.
		t.Skip("not root: no second uid to play (the refusal and --isolate cases need one)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecondUID$")
	cmd.Env = append(os.Environ(), envRole+"=nobody", "CHILD_POOL="+poolSock, "CHILD_OPT="+optSock, "CHILD_CLOSED="+closedSock)
	ipctest.AsUser(t, cmd, ipctest.Nobody, ipctest.Nobody)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nobody's client: %v\n%s", err, out)
	}
	want := []string{
		"closed: permission_denied",
		"root's buffers: optimizer.bad_tensor",
		"root's run name: ok",
		"own run: ok",
	}
	got := strings.Split(strings.TrimSpace(strings.TrimSuffix(string(out), "PASS\n")), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("nobody's client said:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	// Root's parameters are as they were, and its run steps on.
	after := ts.values(t)
	for i := range before {
		for k := range before[i] {
			if before[i][k] != after[i][k] {
				t.Fatalf("root's param %d [%d] changed: %v → %v", i, k, before[i][k], after[i][k])
			}
		}
	}
	if err := ts.step(ro, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatalf("root's run after nobody's: %v", err)
	}
}

// nobodyClient is TestSecondUID's second uid: it prints one line per
// attempt (the error code, or ok) and exits 0.
func nobodyClient() {
	pc, err := pool.Dial(os.Getenv("CHILD_POOL"))
	if err != nil {
		fmt.Println("pool:", err)
		os.Exit(1)
	}
	code := func(err error) string {
		var re *ipc.RemoteError
		switch {
		case err == nil:
			return "ok"
		case errors.As(err, &re):
			return re.Code
		}
		return err.Error()
	}
	try := func(sock string, body map[string]any) error {
		conn, err := ipc.Dial(sock)
		if err != nil {
			return err
		}
		c := ipc.NewClient(conn)
		defer c.Close()
		f, err := pc.Handover()
		if err != nil {
			return err
		}
		defer f.Close()
		var reply map[string]any
		_, err = c.Call(context.Background(), service.OpRegister, body, &reply, int(f.Fd()))
		if err == nil {
			_, err = c.Call(context.Background(), service.OpStep, nil, nil)
		}
		return err
	}
	roots := registerMap("mine", "sgd", tensorMap("root/params/layer0.weight", 33, 20), tensorMap("root/grads/layer0.weight", 33, 20))
	fmt.Println("closed:", code(try(os.Getenv("CHILD_CLOSED"), roots)))
	fmt.Println("root's buffers:", code(try(os.Getenv("CHILD_OPT"), roots)))
	// Its own buffers, under the run name root uses: the service's run
	// names are each uid's own.
	for _, n := range []string{"nobody/params/w", "nobody/grads/w"} {
		if _, err := pc.Alloc(n, 64); err != nil {
			fmt.Println("alloc:", err)
			os.Exit(1)
		}
	}
	own := registerMap("root", "sgd", tensorMap("nobody/params/w", 16), tensorMap("nobody/grads/w", 16))
	fmt.Println("root's run name:", code(try(os.Getenv("CHILD_OPT"), own)))
	own["run"] = "nobody"
	fmt.Println("own run:", code(try(os.Getenv("CHILD_OPT"), own)))
	pc.Close()
}

// Item 5: out of file descriptors, a register fails alone, and the service
// serves again once descriptors are free; the pool keeps none of the
// failed runs' leases.
func TestFDExhaustion(t *testing.T) {
	dir := t.TempDir()
	poolSock, optSock := dir+"/pool.sock", dir+"/opt.sock"
	daemon(t, "gpupool", "serve", "--socket", poolSock, "--backend", "host")
	opt := daemon(t, "optimizer", "serve", "--socket", optSock, "--pool", poolSock, "--max-conns", "1000")
	const nofile = 48
	if err := unix.Prlimit(opt.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: nofile, Max: nofile}, nil); err != nil {
		t.Fatal(err)
	}
	ts := newTrainerSide(t, poolSock, "fd", 1)
	base := poolStats(t, ts.pc)
	c, err := service.Dial(optSock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Idle connections take every descriptor the service has.
	var idle []*ipc.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 2*nofile; i++ {
		conn, err := ipc.Dial(optSock)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, conn)
	}
	time.Sleep(100 * time.Millisecond) // the service accepts (or sheds) them
	_, err = c.Register(ts.e, serviceRegistration(ts, "fd"))
	if err == nil {
		t.Fatal("register succeeded with no descriptors left")
	}
	var re *ipc.RemoteError
	if !errors.As(err, &re) || re.Code == "internal" {
		t.Fatalf("register out of descriptors: %v (want the service's reason)", err)
	}
	t.Logf("out of descriptors: %v", err)
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	// The same connection registers once descriptors are back.
	var ro *service.Remote
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ro, err = c.Register(ts.e, serviceRegistration(ts, "fd")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("register after the idle connections closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := ts.step(ro, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatal(err)
	}
	ro.Free()
	// Nothing of the failed registers is left in the pool.
	waitPool(t, ts.pc, "the service's leases are back", func(s pool.Stats) bool {
		return s.Clients == base.Clients && s.Allocations == base.Allocations
	})
	if opt.ProcessState != nil {
		t.Fatal("the service exited")
	}
}

func serviceRegistration(ts *trainerSide, run string) service.Registration {
	s, _ := optim.Defaults("adamw")
	return service.Registration{Run: run, Spec: s, Params: ts.params, Buffers: ts.book, Mem: ts.pc}
}

// Item 7: a client killed during a step (a slow one: Shampoo's roots on
// the host) has its run's name free at once: an immediate register of the
// same name works, every time; a client that closes its connection
// without waiting can re-register the name at once too.
func TestKilledClientReleasedAtOnce(t *testing.T) {
	if os.Getenv(envRole) == "slow" {
		slowTrainer(t)
		return
	}
	st := startStack(t, "host")
	ts := newTrainerSide(t, st.pool, "again", 8)
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKilledClientReleasedAtOnce$")
		cmd.Env = append(os.Environ(), envRole+"=slow", "CHILD_POOL="+st.pool, "CHILD_OPT="+st.opt, fmt.Sprintf("CHILD_PREFIX=slow%d", round))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "stepping" {
			t.Fatalf("child: %q %v", line, err)
		}
		time.Sleep(30 * time.Millisecond) // inside a step
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		start := time.Now()
		// Shampoo over a parameter of the child's name: the state's
		// pool names are the child's too, unbound by the takeover.
		ro := ts.register(t, st.opt, "slow", e2eSpec(t, "shampoo"))
		t.Logf("round %d: registered %v after the kill", round, time.Since(start))
		if err := ro.Free(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 20; i++ {
		c, err := service.Dial(st.opt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Register(ts.e, serviceRegistration(ts, "closed")); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		c.Close() // no close op: the connection just ends
	}
}

// slowTrainer registers "slow" with a Shampoo whose every step computes
// 256×256 roots on the host, and steps until killed.
func slowTrainer(t *testing.T) {
	ts := newTrainerSideTB(t, os.Getenv("CHILD_POOL"), os.Getenv("CHILD_PREFIX"), [][]int{{256, 256}}, 4)
	s, _ := optim.Defaults("shampoo")
	s.MaxBlock, s.UpdateFreq = 256, 1
	ro := ts.register(t, os.Getenv("CHILD_OPT"), "slow", s)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; ; i++ {
		if i == 1 {
			fmt.Println("stepping")
		}
		if err := ts.step(ro, r); err != nil {
			t.Fatal(err)
		}
	}
}

// Memory per run is bounded: --max-run-bytes refuses a run whose state
// would pass it, naming the limit; the service goes on.
func TestMaxRunBytes(t *testing.T) {
	dir := t.TempDir()
	poolSock, optSock := dir+"/pool.sock", dir+"/opt.sock"
	daemon(t, "gpupool", "serve", "--socket", poolSock, "--backend", "host")
	daemon(t, "optimizer", "serve", "--socket", optSock, "--pool", poolSock, "--max-run-bytes", "16KiB")
	ts := newTrainerSideTB(t, poolSock, "mr", [][]int{{64, 64}}, 1)
	c, err := service.Dial(optSock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Register(ts.e, serviceRegistration(ts, "mr"))
	if !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "--max-run-bytes") {
		t.Fatalf("a run over --max-run-bytes: %v", err)
	}
	small := newTrainerSideTB(t, poolSock, "ms", [][]int{{8, 8}}, 1)
	ro, err := c.Register(small.e, serviceRegistration(small, "ms"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := ro.Stats()
	if err != nil || st.RunBytes <= 0 || st.RunBytes > 16<<10 || st.MaxRunBytes != 16<<10 {
		t.Fatalf("stats: %+v %v", st, err)
	}
	ro.Free()
}
