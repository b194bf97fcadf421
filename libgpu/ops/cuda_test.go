package ops_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// fakeCUDA claims to be a CUDA device but has no CUDA context, as a device
// of another process or a misconfigured wrapper would.
type fakeCUDA struct{ *device.Host }

func (fakeCUDA) Kind() device.Kind { return device.KindCUDA }
func (fakeCUDA) String() string    { return "cuda:9 fake" }

// TestCUDAEngineWithoutContext runs everywhere: an engine for a CUDA-kind
// device that is not a usable GPU is a clean error, not a panic.
func TestCUDAEngineWithoutContext(t *testing.T) {
	_, err := ops.NewEngine(fakeCUDA{device.NewHost()}, ops.Options{Precision: ops.PrecTF32})
	if !errors.Is(err, exec.ErrNoBackend) {
		t.Fatalf("NewEngine on a fake CUDA device: %v, want ErrNoBackend", err)
	}
	// Without a GPU, there is no CUDA device to make an engine for: the
	// device constructor says so.
	if !cuda.Available() {
		if _, err := device.NewCUDA(0); !device.NoGPU(err) {
			t.Fatalf("NewCUDA(0) without a GPU: %v", err)
		}
	}
}

func gpu(t testing.TB) *device.CUDA {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func cudaEngine(t testing.TB, d device.Device, prec ops.Precision) *ops.Engine {
	t.Helper()
	e, err := ops.NewEngine(d, ops.Options{Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

var precs = []struct {
	name string
	prec ops.Precision
	tol  float64
}{
	{"f32", ops.PrecF32, 1e-5},
	{"tf32", ops.PrecTF32, 1e-3},
	{"bf16", ops.PrecBF16, 1e-2},
}

// TestCUDACheckImpl runs the whole opstest suite (every op against float64
// references at shapes that are not multiples of 8, outputs poisoned with
// NaN first, gradients against finite differences, validation) on the GPU
// at each precision, with cuBLASLt's fused epilogues and without them.
func TestCUDACheckImpl(t *testing.T) {
	d := gpu(t)
	for _, fused := range []bool{true, false} {
		for _, p := range precs {
			t.Run(fmt.Sprintf("%s/fused=%v", p.name, fused), func(t *testing.T) {
				defer ops.SetCUDAFusion(fused)()
				opstest.CheckImpl(t, d, ops.Options{Precision: p.prec}, p.tol)
			})
		}
	}
	// Which epilogues fell back to the unfused path on this GPU (expected:
	// none); logged so a change of cuBLASLt is visible.
	for _, p := range precs {
		e := cudaEngine(t, d, p.prec)
		runLinears(t, e, 61, 130, 31)
		runChain(t, e, 61, 130, 31)
		for spec, err := range ops.CUDARejectedEpilogues(e) {
			t.Logf("%s: epilogue %d rejected for %dx%dx%d: %v", p.name, spec.Epilogue, spec.M, spec.N, spec.K, err)
		}
	}
}

// TestCUDAFamilies runs every registered op family's checks (forward
// against float64 references with outputs poisoned, gradients against
// finite differences, accumulation, validation) on the GPU at f32, TF32 and
// bf16, with cuBLASLt's fused epilogues and without them.
func TestCUDAFamilies(t *testing.T) {
	d := gpu(t)
	for _, fused := range []bool{true, false} {
		for _, p := range precs {
			t.Run(fmt.Sprintf("%s/fused=%v", p.name, fused), func(t *testing.T) {
				cudatest.RequireGPU(t)
				defer ops.SetCUDAFusion(fused)()
				opstest.CheckFamilies(t, d, ops.Options{Precision: p.prec}, func(t *testing.T) { cudatest.RequireGPU(t) })
			})
		}
	}
}

// TestCUDAChainEpiloguesFused: at the trainer's kind of shape (every
// dimension a multiple of 128) under TF32, cuBLASLt accepts every epilogue
// the chained backward relies on — RELU_AUX_BIAS and GELU_AUX_BIAS forward,
// DRELU_BGRAD and DGELU_BGRAD on the dx GEMM, BGRADB on the dw GEMM — so
// nothing falls back to the element-wise kernels.
func TestCUDAChainEpiloguesFused(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	runChain(t, e, 256, 384, 128)
	for spec, err := range ops.CUDARejectedEpilogues(e) {
		t.Errorf("tf32: epilogue %d rejected for %dx%dx%d (falls back to unfused kernels): %v", spec.Epilogue, spec.M, spec.N, spec.K, err)
	}
}

// runChain runs Linear with the chained backward's aux (ReLU bit-mask,
// GELU z) and LinearBackwardChain with every previous activation once.
func runChain(t *testing.T, e *ops.Engine, m, k, n int) {
	t.Helper()
	a := device.Local{Dev: e.Device()}
	r := rand.New(rand.NewPCG(3, 4))
	x := opstest.Upload(t, a, opstest.Rand(r, m*k), m, k)
	w := opstest.Upload(t, a, opstest.Rand(r, n*k), n, k)
	b := opstest.Upload(t, a, opstest.Rand(r, n), n)
	dz := opstest.Upload(t, a, opstest.Rand(r, m*n), m, n)
	y := opstest.Empty(t, a, tensor.F32, m, n)
	mask := opstest.Empty(t, a, tensor.U8, m, ops.ReLUMaskCols(n))
	z := opstest.Empty(t, a, tensor.F32, m, n)
	if err := e.Linear(y, x, w, b, mask, ops.ActReLU); err != nil {
		t.Fatal(err)
	}
	if err := e.Linear(y, x, w, b, z, ops.ActGELU); err != nil {
		t.Fatal(err)
	}
	// The backward of a layer n → k whose input x came from the layer above.
	prevMask := opstest.Empty(t, a, tensor.U8, m, ops.ReLUMaskCols(k))
	if err := e.Linear(x, opstest.Upload(t, a, opstest.Rand(r, m*n), m, n), opstest.Upload(t, a, opstest.Rand(r, k*n), k, n), nil, prevMask, ops.ActReLU); err != nil {
		t.Fatal(err)
	}
	zPrev := opstest.Upload(t, a, opstest.Rand(r, m*k), m, k)
	dx, dw, db, dbPrev := opstest.Empty(t, a, tensor.F32, m, k), opstest.Empty(t, a, tensor.F32, n, k), opstest.Empty(t, a, tensor.F32, n), opstest.Empty(t, a, tensor.F32, k)
	for _, c := range []struct {
		act ops.Act
		aux *tensor.Tensor
	}{{ops.ActNone, nil}, {ops.ActReLU, prevMask}, {ops.ActGELU, zPrev}} {
		if err := e.LinearBackwardChain(dx, dw, db, dbPrev, dz, x, w, c.aux, c.act); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Device().Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestCUDALinearChainManyRows: the chained backward with a batch of 1000
// rows (many column tiles feeding the fused bias-gradient reductions; more
// than one block of the unfused column sum), fused and unfused, against the
// float64 reference, and bitwise equal on a second run (determinism of the
// BGRAD epilogues, which the trainer's graph-vs-eager check relies on).
func TestCUDALinearChainManyRows(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 11))
	const m, k, n = 1000, 136, 45
	for _, fused := range []bool{true, false} {
		for _, p := range precs[:2] { // f32, tf32
			restore := ops.SetCUDAFusion(fused)
			e := cudaEngine(t, d, p.prec)
			restore()
			for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
				name := fmt.Sprintf("%s/fused=%v/%v", p.name, fused, act)
				zf := opstest.F64(opstest.Rand(r, m*k))
				xf := make([]float64, len(zf))
				for i, z := range zf {
					xf[i] = opstest.ActRef(act, z)
				}
				x := opstest.Upload(t, a, opstest.F32(xf), m, k)
				xf = opstest.F64(opstest.F32(xf))
				wv, dzv := opstest.Rand(r, n*k), opstest.Rand(r, m*n)
				w, dz := opstest.Upload(t, a, wv, n, k), opstest.Upload(t, a, dzv, m, n)
				var aux *tensor.Tensor
				switch act {
				case ops.ActReLU:
					aux = opstest.UploadU8(t, a, opstest.ReLUMaskRef(zf, m, k), m, ops.ReLUMaskCols(k))
				case ops.ActGELU:
					aux = opstest.Upload(t, a, opstest.F32(zf), m, k)
				}
				var first [][]byte
				for run := 0; run < 2; run++ {
					dx, dw := opstest.Empty(t, a, tensor.F32, m, k), opstest.Empty(t, a, tensor.F32, n, k)
					db, dbPrev := opstest.Empty(t, a, tensor.F32, n), opstest.Empty(t, a, tensor.F32, k)
					if err := e.LinearBackwardChain(dx, dw, db, dbPrev, dz, x, w, aux, act); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					outs := []*tensor.Tensor{dx, dw, db, dbPrev}
					if run == 0 {
						wdx, wdw, wdb, wdbPrev := opstest.LinearBackwardChainRef(opstest.F64(dzv), xf, opstest.F64(wv), zf, m, k, n, act)
						for i, want := range [][]float64{wdx, wdw, wdb, wdbPrev} {
							near(t, fmt.Sprintf("%s %s", name, []string{"dxPrev", "dw", "db", "dbPrev"}[i]), opstest.Download(t, outs[i]), want, p.tol)
						}
					}
					for i, o := range outs {
						if err := d.Sync(); err != nil {
							t.Fatal(err)
						}
						b, err := o.Read()
						if err != nil {
							t.Fatal(err)
						}
						if run == 0 {
							first = append(first, b)
						} else if !bytes.Equal(b, first[i]) {
							t.Errorf("%s: %s differs between two runs", name, []string{"dxPrev", "dw", "db", "dbPrev"}[i])
						}
					}
				}
			}
		}
	}
}

// runLinears runs Linear and LinearBackward with every activation once.
func runLinears(t *testing.T, e *ops.Engine, m, k, n int) {
	t.Helper()
	a := device.Local{Dev: e.Device()}
	r := rand.New(rand.NewPCG(1, 2))
	x := opstest.Upload(t, a, opstest.Rand(r, m*k), m, k)
	w := opstest.Upload(t, a, opstest.Rand(r, n*k), n, k)
	b := opstest.Upload(t, a, opstest.Rand(r, n), n)
	y, z := opstest.Empty(t, a, tensor.F32, m, n), opstest.Empty(t, a, tensor.F32, m, n)
	dx, dw, db := opstest.Empty(t, a, tensor.F32, m, k), opstest.Empty(t, a, tensor.F32, n, k), opstest.Empty(t, a, tensor.F32, n)
	for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
		if err := e.Linear(y, x, w, b, z, act); err != nil {
			t.Fatal(err)
		}
		if err := e.Linear(y, x, w, b, nil, act); err != nil {
			t.Fatal(err)
		}
		if err := e.LinearBackward(dx, dw, db, y, x, w, z, act); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Device().Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestCUDALinearManyRows covers what CheckImpl's small shapes do not: more
// rows than one column-sum block (the two-stage bias-gradient reduction of
// the unfused path) and a batch larger than the other dimensions.
func TestCUDALinearManyRows(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 7))
	const m, k, n = 1000, 37, 45
	for _, fused := range []bool{true, false} {
		restore := ops.SetCUDAFusion(fused)
		e := cudaEngine(t, d, ops.PrecF32)
		restore()
		for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
			name := fmt.Sprintf("fused=%v/%v", fused, act)
			xv, wv, bv, dyv := opstest.Rand(r, m*k), opstest.Rand(r, n*k), opstest.Rand(r, n), opstest.Rand(r, m*n)
			x, w, b := opstest.Upload(t, a, xv, m, k), opstest.Upload(t, a, wv, n, k), opstest.Upload(t, a, bv, n)
			dy := opstest.Upload(t, a, dyv, m, n)
			y, z := opstest.Empty(t, a, tensor.F32, m, n), opstest.Empty(t, a, tensor.F32, m, n)
			if err := e.Linear(y, x, w, b, z, act); err != nil {
				t.Fatal(err)
			}
			wantY, wantZ := opstest.LinearRef(opstest.F64(xv), opstest.F64(wv), opstest.F64(bv), m, k, n, act)
			near(t, name+" y", opstest.Download(t, y), wantY, 1e-5)
			near(t, name+" z", opstest.Download(t, z), wantZ, 1e-5)
			saved := z
			if act == ops.ActReLU {
				saved = y
			}
			dx, dw, db := opstest.Empty(t, a, tensor.F32, m, k), opstest.Empty(t, a, tensor.F32, n, k), opstest.Empty(t, a, tensor.F32, n)
			if err := e.LinearBackward(dx, dw, db, dy, x, w, saved, act); err != nil {
				t.Fatal(err)
			}
			wdx, wdw, wdb := opstest.LinearBackwardRef(opstest.F64(dyv), opstest.F64(xv), opstest.F64(wv), wantZ, m, k, n, act)
			near(t, name+" dx", opstest.Download(t, dx), wdx, 1e-5)
			near(t, name+" dw", opstest.Download(t, dw), wdw, 1e-5)
			near(t, name+" db", opstest.Download(t, db), wdb, 1e-5)
		}
	}
}

func near(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if err := opstest.TermsErr(got, want, nil); !(err <= tol) {
		t.Errorf("%s: relative error %.3g > %.3g", what, err, tol)
	}
}

// TestCUDAOptimizersManyTensors: more tensors than one multi-tensor launch
// takes (32), tensors spanning several blocks, and empty tensors.
func TestCUDAOptimizersManyTensors(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 8))
	sizes := []int{0, 1, 2047, 2048, 2049, 5000}
	for len(sizes) < 75 {
		sizes = append(sizes, 1+r.IntN(3000))
	}
	upload := func(v []float64, n int) *tensor.Tensor { return opstest.Upload(t, a, opstest.F32(v), n) }
	var ps, gs, ms, vs, bs []*tensor.Tensor
	var pf, gf, mf, vf, spf, bf [][]float64
	var tpf, tmf, tspf, tbf [][]float64 // the terms' sizes of AdamW's p and m, SGD's p and buf
	for _, n := range sizes {
		p, g := opstest.F64(opstest.Rand(r, n)), opstest.F64(opstest.Rand(r, n))
		pf, gf = append(pf, p), append(gf, g)
		tpf, tmf = append(tpf, opstest.Abs(p)), append(tmf, make([]float64, n))
		tspf, tbf = append(tspf, opstest.Abs(p)), append(tbf, make([]float64, n))
		mf, vf, bf = append(mf, make([]float64, n)), append(vf, make([]float64, n)), append(bf, make([]float64, n))
		spf = append(spf, append([]float64(nil), p...))
		ps, gs = append(ps, upload(p, n)), append(gs, upload(g, n))
		ms, vs, bs = append(ms, upload(make([]float64, n), n)), append(vs, upload(make([]float64, n), n)), append(bs, upload(make([]float64, n), n))
	}
	sp := make([]*tensor.Tensor, len(sizes)) // SGD's own parameter copies
	for i, n := range sizes {
		sp[i] = upload(spf[i], n)
	}
	step := opstest.UploadI32(t, a, []int32{0}, 1)
	cfg := ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.05}
	sgd := ops.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 1e-3}
	for k := 1; k <= 3; k++ {
		if err := e.AdamW(ps, gs, ms, vs, step, cfg); err != nil {
			t.Fatal(err)
		}
		if err := e.SGD(sp, gs, bs, sgd); err != nil {
			t.Fatal(err)
		}
		for i := range sizes {
			opstest.AdamWTermsRef(tpf[i], tmf[i], gf[i], vf[i], k, cfg)
			opstest.AdamWRef(pf[i], gf[i], mf[i], vf[i], k, cfg)
			opstest.SGDTermsRef(tspf[i], tbf[i], gf[i], sgd)
			opstest.SGDRef(spf[i], gf[i], bf[i], sgd)
		}
	}
	if got := opstest.DownloadI32(t, step)[0]; got != 3 {
		t.Fatalf("step counter %d, want 3", got)
	}
	for i, n := range sizes {
		if n == 0 {
			continue
		}
		for _, c := range []struct {
			what        string
			got         *tensor.Tensor
			want, terms []float64
		}{{"adamw p", ps[i], pf[i], tpf[i]}, {"adamw m", ms[i], mf[i], tmf[i]}, {"adamw v", vs[i], vf[i], nil},
			{"sgd p", sp[i], spf[i], tspf[i]}, {"sgd buf", bs[i], bf[i], tbf[i]}} {
			if err := opstest.TermsErr(opstest.Download(t, c.got), c.want, c.terms); !(err <= 1e-5) {
				t.Errorf("tensor %d (%d elements) %s: error %.3g relative to the terms' size", i, n, c.what, err)
			}
		}
	}
}

// TestCUDACrossEntropyDenseDeterministic: cross-entropy over many rows of
// dense labels (the MLP's loss; many blocks feeding the fixed-order mean)
// gives bitwise the same loss and gradient on every run, close to the
// reference; an out-of-range label makes the loss NaN.
func TestCUDACrossEntropyDenseDeterministic(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 9))
	const m, c = 3001, 37
	xv := opstest.Rand(r, m*c)
	for i := range xv {
		xv[i] *= 8
	}
	lab := make([]int32, m)
	for i := range lab {
		lab[i] = int32(r.IntN(c))
	}
	logits, labels := opstest.Upload(t, a, xv, m, c), opstest.UploadI32(t, a, lab, m)
	var first [2][]byte
	for run := 0; run < 3; run++ {
		loss, dl := opstest.Empty(t, a, tensor.F32, 1), opstest.Empty(t, a, tensor.F32, m, c)
		if err := e.CrossEntropy(loss, dl, logits, labels, false); err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
		lb, err := loss.Read()
		if err != nil {
			t.Fatal(err)
		}
		db, err := dl.Read()
		if err != nil {
			t.Fatal(err)
		}
		if run == 0 {
			first = [2][]byte{lb, db}
			wl, wd := opstest.SoftmaxCrossEntropyRef(opstest.F64(xv), lab, m, c)
			tl, td := opstest.CrossEntropyTerms(opstest.F64(xv), lab, m, c)
			opstest.Close(t, "loss", opstest.Download(t, loss), []float64{wl}, []float64{tl}, 1e-5)
			opstest.Close(t, "dlogits", opstest.Download(t, dl), wd, td, 1e-5)
			continue
		}
		if !bytes.Equal(lb, first[0]) || !bytes.Equal(db, first[1]) {
			t.Fatalf("run %d differs from run 0", run)
		}
	}
	lab[m/2] = c // out of range
	bad := opstest.UploadI32(t, a, lab, m)
	loss, dl := opstest.Empty(t, a, tensor.F32, 1), opstest.Empty(t, a, tensor.F32, m, c)
	if err := e.CrossEntropy(loss, dl, logits, bad, false); err != nil {
		t.Fatal(err)
	}
	if got := opstest.Download(t, loss)[0]; !math.IsNaN(got) {
		t.Fatalf("loss with an out-of-range label = %v, want NaN", got)
	}
}

// mlp is a three-layer classifier with every op of a training step:
// Linear (GELU, saving z) → Linear (ReLU) → Linear → softmax cross-entropy
// → three LinearBackward → AdamW. With chain, the ReLU layer saves its
// bit-mask and the backward is three LinearBackwardChain (as nn.MLP runs
// it), where dy1 and dy2 hold the gradients of the pre-activations.
type mlp struct {
	e                      *ops.Engine
	chain                  bool
	mask2                  *tensor.Tensor
	x, labels, step, loss  *tensor.Tensor
	w, b, gw, gb, mw, vw   [3]*tensor.Tensor
	mb, vb                 [3]*tensor.Tensor
	z1, y1, y2, logits, dl *tensor.Tensor
	dy1, dy2               *tensor.Tensor
}

func newMLP(t *testing.T, e *ops.Engine, seed uint64, chain bool) *mlp {
	const m, k, h1, h2, c = 37, 29, 45, 23, 11
	a := device.Local{Dev: e.Device()}
	r := rand.New(rand.NewPCG(seed, 10))
	empty := func(shape ...int) *tensor.Tensor { return opstest.Empty(t, a, tensor.F32, shape...) }
	zeros := func(shape ...int) *tensor.Tensor {
		return opstest.Upload(t, a, make([]float32, tensor.Numel(shape)), shape...)
	}
	n := &mlp{e: e, chain: chain, x: opstest.Upload(t, a, opstest.Rand(r, m*k), m, k)}
	if chain {
		n.mask2 = opstest.Empty(t, a, tensor.U8, m, ops.ReLUMaskCols(h2))
	}
	lab := make([]int32, m)
	for i := range lab {
		lab[i] = int32(r.IntN(c))
	}
	n.labels = opstest.UploadI32(t, a, lab, m)
	n.step = opstest.UploadI32(t, a, []int32{0}, 1)
	n.loss = empty(1)
	dims := [][2]int{{h1, k}, {h2, h1}, {c, h2}}
	for i, dm := range dims {
		wv := opstest.Rand(r, dm[0]*dm[1])
		for j := range wv {
			wv[j] /= float32(math.Sqrt(float64(dm[1])))
		}
		n.w[i] = opstest.Upload(t, a, wv, dm[0], dm[1])
		n.b[i] = opstest.Upload(t, a, opstest.Rand(r, dm[0]), dm[0])
		n.gw[i], n.gb[i] = empty(dm[0], dm[1]), empty(dm[0])
		n.mw[i], n.vw[i] = zeros(dm[0], dm[1]), zeros(dm[0], dm[1])
		n.mb[i], n.vb[i] = zeros(dm[0]), zeros(dm[0])
	}
	n.z1, n.y1, n.dy1 = empty(m, h1), empty(m, h1), empty(m, h1)
	n.y2, n.dy2 = empty(m, h2), empty(m, h2)
	n.logits, n.dl = empty(m, c), empty(m, c)
	return n
}

func (n *mlp) trainStep() error {
	e := n.e
	steps := []func() error{
		func() error { return e.Linear(n.y1, n.x, n.w[0], n.b[0], n.z1, ops.ActGELU) },
		func() error { return e.Linear(n.y2, n.y1, n.w[1], n.b[1], n.mask2, ops.ActReLU) },
		func() error { return e.Linear(n.logits, n.y2, n.w[2], n.b[2], nil, ops.ActNone) },
		func() error { return e.CrossEntropy(n.loss, n.dl, n.logits, n.labels, false) },
	}
	if n.chain {
		steps = append(steps,
			func() error {
				return e.LinearBackwardChain(n.dy2, n.gw[2], n.gb[2], n.gb[1], n.dl, n.y2, n.w[2], n.mask2, ops.ActReLU)
			},
			func() error {
				return e.LinearBackwardChain(n.dy1, n.gw[1], nil, n.gb[0], n.dy2, n.y1, n.w[1], n.z1, ops.ActGELU)
			},
			func() error {
				return e.LinearBackwardChain(nil, n.gw[0], nil, nil, n.dy1, n.x, n.w[0], nil, ops.ActNone)
			})
	} else {
		steps = append(steps,
			func() error { return e.LinearBackward(n.dy2, n.gw[2], n.gb[2], n.dl, n.y2, n.w[2], nil, ops.ActNone) },
			func() error { return e.LinearBackward(n.dy1, n.gw[1], n.gb[1], n.dy2, n.y1, n.w[1], n.y2, ops.ActReLU) },
			func() error { return e.LinearBackward(nil, n.gw[0], n.gb[0], n.dy1, n.x, n.w[0], n.z1, ops.ActGELU) })
	}
	steps = append(steps,
		func() error {
			var ps, gs, ms, vs []*tensor.Tensor
			for i := range n.w {
				ps, gs = append(ps, n.w[i], n.b[i]), append(gs, n.gw[i], n.gb[i])
				ms, vs = append(ms, n.mw[i], n.mb[i]), append(vs, n.vw[i], n.vb[i])
			}
			return e.AdamW(ps, gs, ms, vs, n.step, ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2})
		})
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// state is every tensor a step writes, as bytes.
func (n *mlp) state(t *testing.T) [][]byte {
	t.Helper()
	if err := n.e.Device().Sync(); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	ts := []*tensor.Tensor{n.loss, n.step, n.logits, n.dl, n.z1, n.y1, n.y2, n.dy1, n.dy2}
	for i := range n.w {
		ts = append(ts, n.w[i], n.b[i], n.gw[i], n.gb[i], n.mw[i], n.vw[i], n.mb[i], n.vb[i])
	}
	if n.chain {
		ts = append(ts, n.mask2)
	}
	for _, x := range ts {
		b, err := x.Read()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestCUDAGraphReplayMatchesEager trains the same MLP from the same start
// twice on one engine: 51 eager steps, and 1 eager (warm-up) step followed
// by one captured step replayed 50 times as a CUDA graph. Every output,
// parameter, moment and the step counter must be bitwise equal, and the loss
// must have fallen.
func TestCUDAGraphReplayMatchesEager(t *testing.T) {
	d := gpu(t)
	const replays = 50
	for _, tc := range []struct {
		p     ops.Precision
		chain bool
	}{{ops.PrecTF32, false}, {ops.PrecBF16, false}, {ops.PrecF32, false}, {ops.PrecTF32, true}, {ops.PrecBF16, true}, {ops.PrecF32, true}} {
		p := tc.p
		t.Run(fmt.Sprintf("%v/chain=%v", p, tc.chain), func(t *testing.T) {
			e := cudaEngine(t, d, p)
			seed := rand.Uint64()
			eager := newMLP(t, e, seed, tc.chain)
			if err := eager.trainStep(); err != nil {
				t.Fatal(err)
			}
			loss0 := opstest.Download(t, eager.loss)[0]
			for i := 0; i < replays; i++ {
				if err := eager.trainStep(); err != nil {
					t.Fatal(err)
				}
			}
			want := eager.state(t)

			graphed := newMLP(t, e, seed, tc.chain)
			if err := graphed.trainStep(); err != nil { // warm-up: scratch, algorithms
				t.Fatal(err)
			}
			s := e.Stream()
			if err := d.Do(func() error { return s.BeginCapture(cuda.CaptureModeGlobal) }); err != nil {
				t.Fatal(err)
			}
			stepErr := graphed.trainStep()
			var g cuda.Graph
			if err := d.Do(func() error { var err error; g, err = s.EndCapture(); return err }); err != nil || stepErr != nil {
				t.Fatalf("capture: step %v, end %v", stepErr, err)
			}
			var x cuda.GraphExec
			if err := d.Do(func() error { var err error; x, err = g.Instantiate(); return err }); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Do(func() error { x.Destroy(); return g.Destroy() }) })
			for i := 0; i < replays; i++ {
				if err := d.Do(func() error { return x.Launch(s) }); err != nil {
					t.Fatal(err)
				}
			}
			got := graphed.state(t)
			names := []string{"loss", "step", "logits", "dlogits", "z1", "y1", "y2", "dy1", "dy2"}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					name := fmt.Sprintf("tensor %d", i)
					if i < len(names) {
						name = names[i]
					}
					t.Errorf("%s differs between graph replay and eager", name)
				}
			}
			if st := opstest.DownloadI32(t, graphed.step)[0]; st != replays+1 {
				t.Fatalf("step counter %d after %d steps", st, replays+1)
			}
			loss := opstest.Download(t, graphed.loss)[0]
			if !(loss < 0.8*loss0) {
				t.Fatalf("loss %v after %d steps, %v after the first: not learning", loss, replays+1, loss0)
			}
			t.Logf("%v: loss %.4f → %.4f", p, loss0, loss)
		})
	}
}
