package server

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// TestMain doubles as the child process of the multi-process tests: with
// GPUPOOL_TEST_CHILD set, the test binary runs child() instead of tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("GPUPOOL_TEST_CHILD"); mode != "" {
		if err := child(mode, os.Getenv("GPUPOOL_TEST_SOCKET")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// backend is one row of the suite: every test that calls forEachBackend
// runs against the host (memfd) daemon and, on a GPU machine, the CUDA one.
type backend struct {
	name string
	gpu  bool
}

var backends = []backend{{"host", false}, {"cuda", true}}

// forEachBackend runs f once per backend as a subtest; the cuda row needs a
// GPU (it skips without one, and fails under GPUKIT_REQUIRE_GPU=1).
func forEachBackend(t *testing.T, f func(t *testing.T, be backend)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			if be.gpu {
				cudatest.RequireGPU(t)
			}
			f(t, be)
		})
	}
}

// testConfig is the part of Config a child daemon is given (JSON).
type testConfig struct {
	SlabSize  int64
	Limit     int64
	Quota     map[uint32]int64
	AllowUID  []uint32
	AllowGID  []uint32
	Idle      time.Duration
	LegacyAll bool
	Ephemeral bool
	Isolate   bool
	// RefuseSelf makes the daemon treat its own uid as any other (for
	// admission tests run by one uid).
	RefuseSelf  bool
	OrphanGrace time.Duration
	MaxConns    int
	ConnSlabs   int
	ConnLeases  int
	ConnMaps    int
	MaxSlabs    int
}

func (tc testConfig) config() Config {
	return Config{SlabSize: tc.SlabSize, Limit: tc.Limit, Quota: tc.Quota, AllowUID: tc.AllowUID, AllowGID: tc.AllowGID,
		Idle: tc.Idle, LegacyAll: tc.LegacyAll, Ephemeral: tc.Ephemeral, Isolate: tc.Isolate,
		OrphanGrace: tc.OrphanGrace, MaxConns: tc.MaxConns, ConnSlabs: tc.ConnSlabs, ConnLeases: tc.ConnLeases,
		ConnMaps: tc.ConnMaps, MaxSlabs: tc.MaxSlabs}
}

// startPool starts a daemon with tc. The host daemon runs in this process
// (its *Pool is returned); the CUDA daemon runs in a child process (the
// test binary in "serve" mode, *Pool nil), so legacy IPC handles it exports
// can be opened here and its death can be tested.
func startPool(t *testing.T, be backend, tc testConfig) (string, *Pool) {
	t.Helper()
	if be.gpu {
		return startChildPool(t, be, tc), nil
	}
	path := filepath.Join(t.TempDir(), "pool.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	p := newTestPool(tc)
	srv := &ipc.Server{Handler: p, MaxConns: p.Config().MaxConns}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		p.Close()
	})
	return path, p
}

// newTestPool is New(tc.config()) with tc's test switches applied.
func newTestPool(tc testConfig) *Pool {
	p := New(tc.config())
	if tc.RefuseSelf {
		p.self = math.MaxUint32
	}
	return p
}

// startChildPool runs the daemon in a child process and returns its socket;
// the child is killed at cleanup (if the test has not killed it).
func startChildPool(t *testing.T, be backend, tc testConfig) string {
	t.Helper()
	cmd, path := childPoolCmd(t, be, tc)
	stdout, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child daemon: %q %v", line, err)
	}
	return path
}

func childPoolCmd(t *testing.T, be backend, tc testConfig) (*exec.Cmd, string) {
	path := filepath.Join(t.TempDir(), "pool.sock")
	js, _ := json.Marshal(tc)
	return childCmd(t, path, "serve", "GPUPOOL_TEST_BACKEND="+be.name, "GPUPOOL_TEST_CONFIG="+string(js)), path
}

func childCmd(t *testing.T, path, mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GPUPOOL_TEST_CHILD="+mode, "GPUPOOL_TEST_SOCKET="+path)
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t.Cleanup(func() {
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("child %s stderr: %s", mode, stderr.String())
		}
	})
	return cmd
}

// child modes:
//
//	serve:   run a daemon (GPUPOOL_TEST_BACKEND, GPUPOOL_TEST_CONFIG) on the
//	         socket, print "ready", serve until stdin closes.
//	hold:    allocate the sizes in GPUPOOL_TEST_SIZES (comma separated; the
//	         first one named "held"), fill them, print "ready", block on stdin.
//	read:    open GPUPOOL_TEST_NAME, print its bytes in hex, then write the
//	         reversed bytes into it and print "done".
//	dial:    connect and print "ok" (or fail with the error).
//	waitopen: allocate 1 MiB, print "waiting", open GPUPOOL_TEST_NAME
//	         waiting up to an hour for its seal.
//	produce: (cuda) create GPUPOOL_TEST_NAME of GPUPOOL_TEST_SIZE bytes,
//	         queue slow work then a memset to 0x5a5a5a5a on a stream,
//	         Ready, Seal, print "ready", block on stdin.
func child(mode, path string) error {
	if mode == "serve" {
		return childServe(path)
	}
	c, err := pool.Dial(path)
	if err != nil {
		return err
	}
	defer c.Close()
	dev := c.Device()
	switch mode {
	case "dial":
		fmt.Println("ok")
		return nil
	case "hold":
		for i, s := range strings.Split(os.Getenv("GPUPOOL_TEST_SIZES"), ",") {
			n, _ := strconv.ParseInt(s, 10, 64)
			name := ""
			if i == 0 {
				name = "held"
			}
			b, err := c.Alloc(name, n)
			if err != nil {
				return err
			}
			fill := make([]byte, n)
			for j := range fill {
				fill[j] = byte(j)
			}
			if err := dev.CopyIn(b, 0, fill); err != nil {
				return err
			}
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return nil
	case "read":
		b, err := c.OpenWait(os.Getenv("GPUPOOL_TEST_NAME"), 10*time.Second)
		if err != nil {
			return err
		}
		mem := make([]byte, b.Size())
		if err := dev.CopyOut(mem, b.Buffer, 0); err != nil {
			return err
		}
		fmt.Println(hex.EncodeToString(mem))
		n := len(mem)
		rev := make([]byte, n)
		for i := range mem {
			rev[i] = mem[n-1-i]
		}
		if err := dev.CopyIn(b.Buffer, 0, rev); err != nil {
			return err
		}
		fmt.Println("done")
		return b.Free()
	case "produce":
		return produce(c)
	case "waitopen":
		// Hold memory, then wait (for ever, in effect) for a seal.
		b, err := c.Alloc("", 1<<20)
		if err != nil {
			return err
		}
		if err := dev.CopyIn(b, 0, make([]byte, 1<<20)); err != nil {
			return err
		}
		fmt.Println("waiting")
		_, err = c.OpenWait(os.Getenv("GPUPOOL_TEST_NAME"), time.Hour)
		return err
	}
	return fmt.Errorf("unknown mode %q", mode)
}

func childServe(path string) error {
	var tc testConfig
	if err := json.Unmarshal([]byte(os.Getenv("GPUPOOL_TEST_CONFIG")), &tc); err != nil {
		return err
	}
	if s := os.Getenv("GPUPOOL_TEST_NOFILE"); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return err
		}
	}
	cfg := tc.config()
	if os.Getenv("GPUPOOL_TEST_BACKEND") == "cuda" {
		d, err := device.NewCUDA(0)
		if err != nil {
			return err
		}
		if cfg.Source, err = NewCUDA(d); err != nil {
			return err
		}
	}
	l, err := ipc.Listen(path)
	if err != nil {
		return err
	}
	p := New(cfg)
	if tc.RefuseSelf {
		p.self = math.MaxUint32
	}
	// The daemon's own account of each connection goes to stderr, which a
	// failing test prints (childCmd).
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	srv := &ipc.Server{Handler: p, MaxConns: p.Config().MaxConns, Logf: logf}
	go func() {
		if err := srv.Serve(l); err != nil {
			logf("serve: %v", err)
		}
	}()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	srv.Shutdown()
	l.Close()
	return p.Close()
}

// produce is the producer of TestEventOrdersConsumer: it queues work long
// enough that an unordered reader would see the old contents.
func produce(c *pool.Client) error {
	d, ok := c.Device().(*device.CUDA)
	if !ok {
		return errors.New("produce needs a cuda pool")
	}
	n, _ := strconv.ParseInt(os.Getenv("GPUPOOL_TEST_SIZE"), 10, 64)
	b, err := c.Create(os.Getenv("GPUPOOL_TEST_NAME"), n, pool.CreateOptions{})
	if err != nil {
		return err
	}
	const scratch = 256 << 20
	var s cuda.Stream
	err = d.Do(func() error {
		if err := cuda.MemsetD8(cuda.DevicePtr(b.Ptr()), 0, n); err != nil {
			return err
		}
		if err := cuda.CtxSynchronize(); err != nil {
			return err
		}
		src, err := cuda.MemAlloc(scratch)
		if err != nil {
			return err
		}
		dst, err := cuda.MemAlloc(scratch)
		if err != nil {
			return err
		}
		if s, err = cuda.StreamCreate(true); err != nil {
			return err
		}
		// About 40 × 0.5 GB of copies (tens of ms) before the memset.
		for range 40 {
			if err := cuda.MemcpyDtoDAsync(dst, src, scratch, s); err != nil {
				return err
			}
		}
		return cuda.MemsetD32Async(cuda.DevicePtr(b.Ptr()), 0x5a5a5a5a, n/4, s)
	})
	if err != nil {
		return err
	}
	if err := b.Ready(s); err != nil {
		return err
	}
	if err := b.Seal(); err != nil {
		return err
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

func dial(t *testing.T, path string) *pool.Client {
	t.Helper()
	c, err := pool.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

func write(t *testing.T, c *pool.Client, b *device.Buffer, off int64, data []byte) {
	t.Helper()
	if err := c.Device().CopyIn(b, off, data); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, c *pool.Client, b *device.Buffer, off, n int64) []byte {
	t.Helper()
	out := make([]byte, n)
	if err := c.Device().CopyOut(out, b, off); err != nil {
		t.Fatal(err)
	}
	return out
}

func waitStats(t *testing.T, c *pool.Client, ok func(pool.Stats) bool) pool.Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never reached the expected state: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startHolder runs a "hold" child and waits until it holds its buffers.
func startHolder(t *testing.T, path, sizes string) *exec.Cmd {
	t.Helper()
	cmd := childCmd(t, path, "hold", "GPUPOOL_TEST_SIZES="+sizes)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	return cmd
}

func device256(n int64) int64 { return (n + Align - 1) / Align * Align }

// slabFor is the shared slab size used by a test on be: the host's page
// granularity allows 1 MiB; VMM slabs are multiples of 2 MiB.
func slabFor(be backend) int64 {
	if be.gpu {
		return 2 << 20
	}
	return 1 << 20
}
