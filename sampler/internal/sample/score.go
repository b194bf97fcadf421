package sample

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Classifier is a Fashion-MNIST MLP trained by `trainer run` (layers
// fc0..fcK, PyTorch's nn.Linear layout, ReLU or GELU between them), used
// to score samples: its argmax labels them, and the input of its last
// layer (the penultimate features, after the activation) is what FD-MLP
// compares.
type Classifier struct {
	e      *ops.Engine
	a      device.Allocator
	Widths []int
	act    ops.Act
	w, b   []*tensor.Tensor
}

// ErrNotClassifier: the file given as a classifier is not a Fashion-MNIST
// MLP of `trainer run` (a runtime failure: the file's content is wrong).
var ErrNotClassifier = errors.New("not a Fashion-MNIST MLP of `trainer run`")

// LoadClassifier reads the MLP at path (its metadata config gives the
// activation; without one, widths come from the weights and act is relu).
// A file that is not such an MLP gives ErrNotClassifier, saying what it
// holds instead.
func LoadClassifier(e *ops.Engine, a device.Allocator, path string) (_ *Classifier, err error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, ok := f.Tensors["fc0.weight"]; !ok {
		what := "no fc0.weight"
		if _, gpt := f.Tensors["transformer.wte.weight"]; gpt {
			what = "it is a GPT checkpoint"
		} else if _, unet := f.Tensors["conv_in.weight"]; unet {
			what = "it is a U-Net checkpoint"
		}
		return nil, fmt.Errorf("%s: %w (%s); give the model.safetensors of a Fashion-MNIST classifier (trainer run --data DIR --out DIR)", path, ErrNotClassifier, what)
	}
	c := &Classifier{e: e, a: a, act: ops.ActReLU}
	defer func() {
		if err != nil {
			c.Free()
		}
	}()
	var meta struct {
		Act string `json:"act"`
	}
	if s, ok := f.Metadata["config"]; ok {
		if err := json.Unmarshal([]byte(s), &meta); err == nil && meta.Act != "" {
			if c.act, err = ops.ParseAct(meta.Act); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	for i := 0; ; i++ {
		n := "fc" + strconv.Itoa(i)
		wi, ok := f.Tensors[n+".weight"]
		if !ok {
			break
		}
		if len(wi.Shape) != 2 || (i > 0 && wi.Shape[1] != c.Widths[i]) {
			return nil, fmt.Errorf("%s: %w (%s.weight is %v)", path, ErrNotClassifier, n, wi.Shape)
		}
		if i == 0 {
			c.Widths = append(c.Widths, wi.Shape[1])
		}
		c.Widths = append(c.Widths, wi.Shape[0])
		w, err := tensor.Alloc(a, "", tensor.F32, wi.Shape...)
		if err != nil {
			return nil, err
		}
		c.w = append(c.w, w)
		b, err := tensor.Alloc(a, "", tensor.F32, wi.Shape[0])
		if err != nil {
			return nil, err
		}
		c.b = append(c.b, b)
		if err := f.Load(n+".weight", w); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := f.Load(n+".bias", b); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if len(c.w) < 2 || c.Widths[0] != 28*28 {
		return nil, fmt.Errorf("%s: %w (layer widths %v; want 784 inputs and two or more layers)", path, ErrNotClassifier, c.Widths)
	}
	return c, nil
}

// Free releases the weights.
func (c *Classifier) Free() {
	for _, t := range append(c.w, c.b...) {
		t.Buf.Free()
	}
}

// FeatureDim is the width of the penultimate features.
func (c *Classifier) FeatureDim() int { return c.Widths[len(c.Widths)-2] }

// Normalize turns samples (f32 [n, S, S, 1] in [−1, 1]) into the
// classifier's inputs: the centre 28×28 crop, quantised to 8-bit pixels
// as a PNG of them would be, normalised as the training data
// ((p/255 − Mean)/Std).
func Normalize(samples []float32, n, size int) []float32 {
	off := (size - 28) / 2
	out := make([]float32, n*784)
	for i := 0; i < n; i++ {
		for y := 0; y < 28; y++ {
			for x := 0; x < 28; x++ {
				p := Pixel(samples[(i*size+y+off)*size+x+off])
				out[i*784+y*28+x] = (float32(p)/255 - data.Mean) / data.Std
			}
		}
	}
	return out
}

// Run computes, for n normalised images x ([n, 784]), the predicted
// classes and the penultimate features ([n, FeatureDim]), batch rows at a
// time.
func (c *Classifier) Run(x []float32, n, batch int) (pred []int32, feats []float32, err error) {
	L := len(c.w)
	bufs := make([]*tensor.Tensor, L+1)
	for i := range bufs {
		if bufs[i], err = tensor.Alloc(c.a, "", tensor.F32, batch, c.Widths[i]); err != nil {
			return nil, nil, err
		}
		defer bufs[i].Buf.Free()
	}
	out, err := tensor.Alloc(c.a, "", tensor.I32, batch)
	if err != nil {
		return nil, nil, err
	}
	defer out.Buf.Free()
	fd := c.FeatureDim()
	pred, feats = make([]int32, n), make([]float32, n*fd)
	chunk := make([]float32, batch*784)
	for i0 := 0; i0 < n; i0 += batch {
		k := min(batch, n-i0)
		clear(chunk)
		copy(chunk, x[i0*784:(i0+k)*784])
		if err := bufs[0].WriteF32(chunk); err != nil {
			return nil, nil, err
		}
		for l := 0; l < L; l++ {
			act := c.act
			if l == L-1 {
				act = ops.ActNone
			}
			if err := c.e.Linear(bufs[l+1], bufs[l], c.w[l], c.b[l], nil, act); err != nil {
				return nil, nil, err
			}
		}
		if err := c.e.Argmax(out, bufs[L]); err != nil {
			return nil, nil, err
		}
		b, err := out.Read() // waits for the device
		if err != nil {
			return nil, nil, err
		}
		copy(pred[i0:i0+k], tensor.BytesAs[int32](b)[:k])
		f, err := bufs[L-1].ReadF32()
		if err != nil {
			return nil, nil, err
		}
		copy(feats[i0*fd:(i0+k)*fd], f[:k*fd])
	}
	return pred, feats, nil
}

// Accuracy is the fraction of pred equal to labels.
func Accuracy(pred, labels []int32) float64 {
	ok := 0
	for i := range pred {
		if pred[i] == labels[i] {
			ok++
		}
	}
	return float64(ok) / float64(len(pred))
}

// Moments are the mean and covariance (unbiased) of n feature rows of
// dimension d.
func Moments(f []float32, n, d int) ([]float64, *mat.SymDense) {
	mu := make([]float64, d)
	for i := 0; i < n; i++ {
		for j := 0; j < d; j++ {
			mu[j] += float64(f[i*d+j])
		}
	}
	for j := range mu {
		mu[j] /= float64(n)
	}
	c := make([]float64, d*d)
	row := make([]float64, d)
	for i := 0; i < n; i++ {
		for j := 0; j < d; j++ {
			row[j] = float64(f[i*d+j]) - mu[j]
		}
		for a := 0; a < d; a++ {
			ra := row[a]
			if ra == 0 {
				continue
			}
			ca := c[a*d:]
			for b := a; b < d; b++ {
				ca[b] += ra * row[b]
			}
		}
	}
	s := mat.NewSymDense(d, nil)
	for a := 0; a < d; a++ {
		for b := a; b < d; b++ {
			s.SetSym(a, b, c[a*d+b]/float64(n-1))
		}
	}
	return mu, s
}

// Frechet is the Fréchet distance between Gaussians N(μ1, Σ1) and
// N(μ2, Σ2) (Dowson & Landau 1982; FID's formula, Heusel et al. 2017):
// |μ1 − μ2|² + Tr(Σ1 + Σ2 − 2(Σ1Σ2)^½), with Tr((Σ1Σ2)^½) computed as
// Σ√λ over the eigenvalues λ of the symmetric Σ1^½Σ2Σ1^½ (the same
// eigenvalues; negative rounding clamped to 0).
func Frechet(mu1 []float64, s1 *mat.SymDense, mu2 []float64, s2 *mat.SymDense) (float64, error) {
	d := len(mu1)
	var dist float64
	for i := range mu1 {
		dist += (mu1[i] - mu2[i]) * (mu1[i] - mu2[i])
	}
	var e1 mat.EigenSym
	if !e1.Factorize(s1, true) {
		return 0, fmt.Errorf("sample: eigendecomposition of the first covariance failed")
	}
	vals := e1.Values(nil)
	var vec mat.Dense
	e1.VectorsTo(&vec)
	// Σ1^½ = V diag(√λ) Vᵀ
	sq := mat.NewDense(d, d, nil)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			var s float64
			for k := 0; k < d; k++ {
				s += vec.At(i, k) * math.Sqrt(math.Max(vals[k], 0)) * vec.At(j, k)
			}
			sq.Set(i, j, s)
		}
	}
	var t, m mat.Dense
	t.Mul(sq, s2)
	m.Mul(&t, sq)
	ms := mat.NewSymDense(d, nil)
	for i := 0; i < d; i++ {
		for j := i; j < d; j++ {
			ms.SetSym(i, j, (m.At(i, j)+m.At(j, i))/2)
		}
	}
	var e2 mat.EigenSym
	if !e2.Factorize(ms, false) {
		return 0, fmt.Errorf("sample: eigendecomposition of Σ1^½Σ2Σ1^½ failed")
	}
	var tr float64
	for _, l := range e2.Values(nil) {
		tr += math.Sqrt(math.Max(l, 0))
	}
	for i := 0; i < d; i++ {
		dist += s1.At(i, i) + s2.At(i, i)
	}
	return dist - 2*tr, nil
}

// ScoreResult is sampler score's result.
type ScoreResult struct {
	Accuracy     float64 // samples labelled as the class they were drawn for
	FD           float64 // FD-MLP against the test set
	TestAccuracy float64 // the classifier's accuracy on the test set (a sanity check)
}

// Score labels n samples (f32 [n, S, S, 1]) drawn for labels with the
// classifier cl and computes FD-MLP against test.
func Score(cl *Classifier, samples []float32, labels []int32, n, size int, test *data.Set) (ScoreResult, error) {
	var r ScoreResult
	if n < 2 {
		return r, fmt.Errorf("%w: FD needs at least 2 samples", ErrUsage)
	}
	const batch = 500
	pred, feats, err := cl.Run(Normalize(samples, n, size), n, batch)
	if err != nil {
		return r, err
	}
	r.Accuracy = Accuracy(pred, labels)
	tx := make([]float32, test.N*784)
	ty := make([]int32, test.N)
	for i := 0; i < test.N; i++ {
		test.Normalize(tx[i*784:(i+1)*784], i)
		ty[i] = int32(test.Labels[i])
	}
	tp, tf, err := cl.Run(tx, test.N, batch)
	if err != nil {
		return r, err
	}
	r.TestAccuracy = Accuracy(tp, ty)
	d := cl.FeatureDim()
	m1, s1 := Moments(feats, n, d)
	m2, s2 := Moments(tf, test.N, d)
	if r.FD, err = Frechet(m1, s1, m2, s2); err != nil {
		return r, err
	}
	return r, nil
}
