package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/pool"
)

// TestLegacyBuffers: alloc(legacy=true) gives a cuMemAlloc buffer with a
// CUipcMemHandle that another process opens (cuda); the host daemon says
// it cannot.
func TestLegacyBuffers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{})
		c := dial(t, path)
		if !be.gpu {
			if _, err := c.Create("l", 100, pool.CreateOptions{Legacy: true}); !errors.Is(err, pool.ErrUnsupported) {
				t.Fatalf("legacy on host: %v", err)
			}
			if c.Hello().Legacy {
				t.Fatal("host daemon says it makes legacy buffers")
			}
			return
		}
		n := 1000 + rand.IntN(100000)
		want := randBytes(n)
		b, err := c.Create("leg", int64(n), pool.CreateOptions{Legacy: true})
		if err != nil {
			t.Fatal(err)
		}
		if sh := b.Share(); sh.Kind != device.ShareLegacyIPC || sh.Legacy == [64]byte{} || sh.Offset != 0 {
			t.Fatalf("share %+v", sh)
		}
		write(t, c, b.Buffer, 0, want)
		if err := b.Seal(); err != nil {
			t.Fatal(err)
		}
		out, err := childCmd(t, path, "read", "GPUPOOL_TEST_NAME=leg").Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		var hexed, done string
		if _, err := fmtSscan(string(out), &hexed, &done); err != nil || done != "done" || hexed != hexString(want) {
			t.Fatalf("child read of a legacy buffer: %v %q", err, done)
		}
		back := read(t, c, b.Buffer, 0, int64(n))
		for i := range back {
			if back[i] != want[n-1-i] {
				t.Fatalf("byte %d after the child's write", i)
			}
		}
		ls, _ := c.Ls()
		if len(ls) != 1 || !ls[0].Legacy {
			t.Fatalf("ls: %+v", ls)
		}
		b.Free()
		if err := c.Remove("leg"); err != nil {
			t.Fatal(err)
		}
		s := waitStats(t, c, func(s pool.Stats) bool { return s.Allocations == 0 })
		if s.Slabs != 0 || s.Reserved != 0 {
			t.Fatalf("legacy buffer's memory not returned: %+v", s)
		}
	})
}

// TestEventOrdersConsumer: a producer process queues ~100 large copies and
// then a memset of the buffer on its stream, records Ready and seals; the
// consumer (this process) opens, Waits on its own stream and copies the
// buffer out on that stream. It must see the memset, which it could not if
// the wait did not order it after the producer's queue.
func TestEventOrdersConsumer(t *testing.T) {
	cudatest.RequireGPU(t)
	be := backends[1]
	path := startChildPool(t, be, testConfig{})
	const n = 64 << 20
	cmd := childCmd(t, path, "produce", "GPUPOOL_TEST_NAME=ordered", "GPUPOOL_TEST_SIZE="+strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("producer: %q %v", line, err)
	}
	c := dial(t, path)
	b, err := c.OpenWait("ordered", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Device().(*device.CUDA)
	var s cuda.Stream
	var host unsafe.Pointer
	err = d.Do(func() error {
		var err error
		if s, err = cuda.StreamCreate(true); err != nil {
			return err
		}
		host, err = cuda.MemHostAlloc(n)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(s); err != nil {
		t.Fatal(err)
	}
	err = d.Do(func() error {
		if err := cuda.MemcpyDtoHAsync(host, cuda.DevicePtr(b.Ptr()), n, s); err != nil {
			return err
		}
		return s.Synchronize()
	})
	if err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*byte)(host), n)
	for i, v := range got {
		if v != 0x5a {
			t.Fatalf("byte %d is %#x: the consumer's stream ran before the producer's work", i, v)
		}
	}
	d.Do(func() error { cuda.MemFreeHost(host); return s.Destroy() })
	// A buffer nobody called Ready on has no event.
	other, err := c.Create("no-event", 256, pool.CreateOptions{Sealed: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Wait(s); !errors.Is(err, pool.ErrNoEvent) {
		t.Fatalf("wait without a Ready: %v", err)
	}
}

// TestDeviceMemoryReturns: after a client holding device memory is killed
// and the daemon releases its empty slabs, the device's free memory
// (cuMemGetInfo) is back where it was.
func TestDeviceMemoryReturns(t *testing.T) {
	cudatest.RequireGPU(t)
	be := backends[1]
	path := startChildPool(t, be, testConfig{SlabSize: 64 << 20, Idle: time.Millisecond})
	c := dial(t, path)
	warm, err := c.Alloc("", 10)
	if err != nil {
		t.Fatal(err)
	}
	warm.Free()
	waitStats(t, c, func(s pool.Stats) bool { return s.Reserved == 0 })
	memFree := func() int64 {
		var f int64
		c.Device().(*device.CUDA).Do(func() error { f, _, err = cuda.MemGetInfo(); return err })
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	before := memFree()
	cmd := startHolder(t, path, "1000,"+strconv.Itoa(300<<20)+",5000000,"+strconv.Itoa(1<<30))
	if during := memFree(); during > before-(1<<30) {
		t.Fatalf("free device memory %d while 1.3 GiB is held, %d before", during, before)
	}
	cmd.Process.Kill()
	cmd.Wait()
	waitStats(t, c, func(s pool.Stats) bool { return s.Allocations == 0 && s.Reserved == 0 && s.Clients == 1 })
	const slack = 2 << 20 // one VMM granule
	deadline := time.Now().Add(20 * time.Second)
	for {
		after := memFree()
		if after >= before-slack {
			t.Logf("free device memory: %d before, %d after", before, after)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("free device memory %d after the kill, %d before", after, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCuPyReadsGoBuffer: examples/python/gpupool_cupy.py (a copy in
// testdata) reads, through CuPy, a legacy buffer this Go client wrote.
func TestCuPyReadsGoBuffer(t *testing.T) {
	cudatest.RequireGPU(t)
	be := backends[1]
	path := startChildPool(t, be, testConfig{})
	c := dial(t, path)
	const rows, cols = 37, 29
	vals := make([]float32, rows*cols)
	raw := make([]byte, 4*len(vals))
	var sum float64
	for i := range vals {
		vals[i] = float32(rand.NormFloat64())
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(vals[i]))
		sum += float64(vals[i])
	}
	b, err := c.Create("py/weights", int64(len(raw)), pool.CreateOptions{Legacy: true, DType: "f32", Shape: []int64{rows, cols}})
	if err != nil {
		t.Fatal(err)
	}
	write(t, c, b.Buffer, 0, raw)
	if err := b.Seal(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", cupyExample(), "--socket", path, "--head", "5", "py/weights")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 gpupool_cupy.py: %v", err)
	}
	var r struct {
		Size  int64     `json:"size"`
		DType string    `json:"dtype"`
		Shape []int     `json:"shape"`
		Sum   float64   `json:"sum"`
		Head  []float64 `json:"head"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if r.Size != int64(len(raw)) || r.DType != "float32" || len(r.Shape) != 2 || r.Shape[0] != rows || r.Shape[1] != cols {
		t.Fatalf("python saw %+v", r)
	}
	if math.Abs(r.Sum-sum) > 1e-9*float64(len(vals)) {
		t.Fatalf("python's sum %v, Go's %v", r.Sum, sum)
	}
	for i, v := range r.Head {
		if float32(v) != vals[i] {
			t.Fatalf("python's value %d is %v, Go wrote %v", i, v, vals[i])
		}
	}
}

// cupyExample is examples/python/gpupool_cupy.py, or the copy the GPU bundle
// (no source tree) puts in testdata/ (scripts/gpu-files.txt).
func cupyExample() string {
	const rel = "../../../examples/python/gpupool_cupy.py"
	if _, err := os.Stat(rel); err == nil {
		return rel
	}
	return "testdata/gpupool_cupy.py"
}
