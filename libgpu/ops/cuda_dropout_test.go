package ops_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDAPhiloxKAT: dropout.cu's Philox4x32-10 reproduces Random123's
// known-answer vectors on the device.
func TestCUDAPhiloxKAT(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecF32)
	out := opstest.Empty(t, device.Local{Dev: d}, tensor.I32, 4)
	for _, c := range opstest.PhiloxKAT {
		if err := ops.CUDAPhilox(e, out, c.Ctr, c.Key); err != nil {
			t.Fatal(err)
		}
		var got [4]uint32
		for i, v := range opstest.DownloadI32(t, out) {
			got[i] = uint32(v)
		}
		if got != c.Want {
			t.Errorf("philox(%08x, %08x) on the GPU = %08x, want %08x", c.Ctr, c.Key, got, c.Want)
		}
	}
}

// dropoutPair holds the same dropout problem on the host and on the GPU.
type dropoutPair struct {
	he, ge     *ops.Engine
	hx, gx     *tensor.Tensor
	hy, gy     *tensor.Tensor
	hctr, gctr *tensor.Tensor
}

func newDropoutPair(t *testing.T, d *device.CUDA, dt tensor.DType, n int, step int32) *dropoutPair {
	hd := device.NewHost()
	he, err := ops.NewEngine(hd, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ha, ga := device.Local{Dev: hd}, device.Local{Dev: d}
	p := &dropoutPair{he: he, ge: cudaEngine(t, d, ops.PrecF32)}
	x := opstest.Rand(rand.New(rand.NewPCG(uint64(n), 1)), n)
	p.hx, p.gx = opstest.Empty(t, ha, dt, n), opstest.Empty(t, ga, dt, n)
	for _, v := range []*tensor.Tensor{p.hx, p.gx} {
		if err := v.WriteFloat32(x); err != nil {
			t.Fatal(err)
		}
	}
	p.hy, p.gy = opstest.Empty(t, ha, dt, n), opstest.Empty(t, ga, dt, n)
	p.hctr = opstest.UploadI32(t, ha, []int32{step}, 1)
	p.gctr = opstest.UploadI32(t, ga, []int32{step}, 1)
	return p
}

// TestCUDADropoutHostBitwise: the GPU's masks and outputs are bitwise the
// host backend's (f32 and bf16; aligned and not; n not a multiple of 4;
// forward, and backward written and in place).
func TestCUDADropoutHostBitwise(t *testing.T) {
	d := gpu(t)
	const seed, site, step = 0x0123456789abcdef, 3, 123456
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, n := range []int{1, 7, 100003, 1 << 20} {
			for _, p := range []float32{0.1, 0.5} {
				t.Run(fmt.Sprintf("%v/n=%d/p=%v", dt, n, p), func(t *testing.T) {
					cp := newDropoutPair(t, d, dt, n, step)
					if err := cp.he.Dropout(cp.hy, cp.hx, p, seed, site, cp.hctr); err != nil {
						t.Fatal(err)
					}
					if err := cp.ge.Dropout(cp.gy, cp.gx, p, seed, site, cp.gctr); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(lnReadBytes(t, cp.he, cp.hy), lnReadBytes(t, cp.ge, cp.gy)) {
						t.Fatal("forward: GPU and host differ")
					}
					// Backward in place (dx = dy = x), from the same counter.
					if err := cp.he.DropoutBackward(cp.hx, cp.hx, p, seed, site, cp.hctr, false); err != nil {
						t.Fatal(err)
					}
					if err := cp.ge.DropoutBackward(cp.gx, cp.gx, p, seed, site, cp.gctr, false); err != nil {
						t.Fatal(err)
					}
					hb, gb := lnReadBytes(t, cp.he, cp.hx), lnReadBytes(t, cp.ge, cp.gx)
					if !bytes.Equal(hb, gb) {
						t.Fatal("backward: GPU and host differ")
					}
					if !bytes.Equal(gb, lnReadBytes(t, cp.ge, cp.gy)) {
						t.Fatal("backward mask differs from the forward's")
					}
				})
			}
		}
	}
	// A misaligned view (one element in) takes the scalar kernel: same bits.
	t.Run("misaligned", func(t *testing.T) {
		cp := newDropoutPair(t, d, tensor.BF16, 1001, step)
		hx, _ := cp.hx.Narrow(0, 1, 1000)
		gx, _ := cp.gx.Narrow(0, 1, 1000)
		hy, _ := cp.hy.Narrow(0, 1, 1000)
		gy, _ := cp.gy.Narrow(0, 1, 1000)
		if err := cp.he.Dropout(hy, hx, 0.25, seed, site, cp.hctr); err != nil {
			t.Fatal(err)
		}
		if err := cp.ge.Dropout(gy, gx, 0.25, seed, site, cp.gctr); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(lnReadBytes(t, cp.he, hy), lnReadBytes(t, cp.ge, gy)) {
			t.Fatal("misaligned: GPU and host differ")
		}
	})
}

// TestCUDADropoutGraphReplay: a captured dropout reads the step from the
// device counter on every replay: after Fill moves the counter, each replay
// equals the eager (host) result at that step, and consecutive steps'
// masks differ.
func TestCUDADropoutGraphReplay(t *testing.T) {
	d := gpu(t)
	const n, p, seed, site = 4099, 0.5, 77, 1
	cp := newDropoutPair(t, d, tensor.BF16, n, 0)
	run := func() error { return cp.ge.Dropout(cp.gy, cp.gx, p, seed, site, cp.gctr) }
	if err := run(); err != nil { // eagerly once: compile before capturing
		t.Fatal(err)
	}
	g, err := cp.ge.Capture(run)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var prev []byte
	for step := 1; step <= 4; step++ {
		if err := cp.ge.Fill(cp.gctr, float64(step)); err != nil {
			t.Fatal(err)
		}
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		got := lnReadBytes(t, cp.ge, cp.gy)
		if err := cp.he.Fill(cp.hctr, float64(step)); err != nil {
			t.Fatal(err)
		}
		if err := cp.he.Dropout(cp.hy, cp.hx, p, seed, site, cp.hctr); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, lnReadBytes(t, cp.he, cp.hy)) {
			t.Fatalf("step %d: replay differs from the eager result", step)
		}
		if bytes.Equal(got, prev) {
			t.Fatalf("step %d: the same mask as the step before", step)
		}
		prev = got
	}
}
