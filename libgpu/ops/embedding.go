package ops

// The embedding family: a row gather (PyTorch's F.embedding) and its
// deterministic scatter-add backward, on the host and on CUDA
// (libgpu/kernels/embedding.cu). Graph.Embedding records it. Reference and
// checks: opstest/embedding.go.

import (
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Embedding gathers rows: y[i..., :] = table[idx[i...], :] (PyTorch's
// F.embedding(idx, table)).
//
// Shapes: table [V, C] f32 or bf16, contiguous; idx i32 of any shape,
// contiguous; y of shape idx.shape + [C], f32 or bf16 (the graph's
// activation dtype), its leading dimensions mergeable into one
// (tensor.View) and its last contiguous (row strides are free).
//
// An index outside [0, V) is an error: the host backend returns ErrLabel
// (and writes nothing); the CUDA backend cannot report it and writes a row
// of zeros for it, reading nothing out of bounds. Other errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) Embedding(y, table, idx *tensor.Tensor) error {
	y2, err := e.checkEmbedding("embedding", "y", y, table, idx)
	if err != nil {
		return err
	}
	n, c, v := y2.Dim(0), y2.Dim(1), table.Dim(0)
	if n == 0 || c == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ix, err := idx.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		if err := checkIndices("embedding", ix, v); err != nil {
			return err
		}
		tb, err := hostIn(table)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(y2, false)
		if err != nil {
			return err
		}
		for r, k := range ix {
			copy(out[r*c:(r+1)*c], tb[int(k)*c:(int(k)+1)*c])
		}
		return commit()
	}, func(cu *cudaImpl) error {
		return cu.embedFwd(y2, table, idx, n, c, v)
	})
}

// EmbeddingBackward computes the table's gradient from y's: for every row
// v of dtable,
//
//	dtable[v, :] = Σ_{i: idx[i] = v} dy[i, :]        (acc false)
//	dtable[v, :] += Σ_{i: idx[i] = v} dy[i, :]       (acc true)
//
// so rows no index names are zero (or keep their values with acc). Shapes
// and dtypes as Embedding: dtable [V, C] f32 or bf16 contiguous (an f32
// master's gradient), dy of y's shape and f32 or bf16 with contiguous
// rows, idx i32 contiguous. Sums are in f32, over the indices in
// increasing position, on every backend: the result is deterministic
// (the CUDA backend sorts the indices, with no float atomics). Indices
// outside [0, V): ErrLabel on the host, skipped on CUDA (the forward wrote
// zeros for them). Other errors as Embedding.
func (e *Engine) EmbeddingBackward(dtable, dy, idx *tensor.Tensor, acc bool) error {
	dy2, err := e.checkEmbedding("embedding backward", "dy", dy, dtable, idx)
	if err != nil {
		return err
	}
	n, c, v := dy2.Dim(0), dy2.Dim(1), dtable.Dim(0)
	if c == 0 || v == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ix, err := idx.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		if err := checkIndices("embedding backward", ix, v); err != nil {
			return err
		}
		g, err := hostIn(dy2)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(dtable, acc)
		if err != nil {
			return err
		}
		clear(out)
		for r, k := range ix {
			dst, src := out[int(k)*c:(int(k)+1)*c], g[r*c:(r+1)*c]
			for j := range dst {
				dst[j] += src[j]
			}
		}
		return commit()
	}, func(cu *cudaImpl) error {
		return cu.embedBwd(dtable, dy2, idx, n, c, v, acc)
	})
}

// checkEmbedding validates an embedding's tensors and returns the
// activation (y or dy) viewed as [N, C].
func (e *Engine) checkEmbedding(op, what string, act, table, idx *tensor.Tensor) (*tensor.Tensor, error) {
	if err := e.checkView(op+" table", table, true, floatTypes); err != nil {
		return nil, err
	}
	if table.Rank() != 2 {
		return nil, fmt.Errorf("%w: %s table is %v, want [V, C]", tensor.ErrShape, op, table.Shape)
	}
	if err := e.checkView(op+" idx", idx, true, []tensor.DType{tensor.I32}); err != nil {
		return nil, err
	}
	want := append(append([]int(nil), idx.Shape...), table.Dim(1))
	if err := e.checkView(op+" "+what, act, false, floatTypes, want...); err != nil {
		return nil, err
	}
	a2, err := act.View(idx.Numel(), table.Dim(1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: leading dimensions not mergeable: %w", op, what, err)
	}
	if err := checkDims(a2.Dim(0), table.Dim(0), table.Dim(1), ldOf(a2)); err != nil {
		return nil, err
	}
	return a2, nil
}

// checkIndices fails with ErrLabel at the first index outside [0, v).
func checkIndices(op string, ix []int32, v int) error {
	for i, k := range ix {
		if k < 0 || int(k) >= v {
			return fmt.Errorf("%w: %s index %d at position %d, vocabulary %d", ErrLabel, op, k, i, v)
		}
	}
	return nil
}

// ---- CUDA ----

// embedFwd launches embed_fwd_<table>_<y>: blocks of (32, 8), a warp per
// row, 4-element vectors where C, the row stride and both base addresses
// allow.
func (c *cudaImpl) embedFwd(y, table, idx *tensor.Tensor, n, cols, v int) error {
	vec := 1
	if cols%4 == 0 && vecAligned(y, 4, ldOf(y)) && vecAligned(table, 4) {
		vec = 4
	}
	return launch.EmbedFwd(c, dtName(table.DType)+dtSuffix(y.DType), grid1((n+7)/8), [3]uint32{32, 8, 1}, 0,
		devPtr(y), devPtr(table), devPtr(idx), int64(n), int32(cols), int64(ldOf(y)), int32(v), int32(vec))
}

// Radix-sort and chunk geometry of embedding.cu (EMB_TILE, EMB_P).
const (
	embTile  = 1024
	embChunk = 32
)

// embedBwd queues the backward: zero dtable (unless acc), sort the indices
// (embedding.cu's stable LSD radix sort, 8 bits a pass over keys in
// [0, V]), then sum runs per chunk (embed_bwd_chunk) and across chunks
// (embed_bwd_span). Scratch: keys and positions twice (n i32 each), the
// digit histograms (256 per tile of 1024 keys), and two f32 rows of C per
// chunk of 32 sorted positions.
func (c *cudaImpl) embedBwd(dtable, dy, idx *tensor.Tensor, n, cols, v int, acc bool) error {
	if !acc {
		if err := c.zero(dtable); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	tiles := (n + embTile - 1) / embTile
	chunks := (n + embChunk - 1) / embChunk
	ptr := func(name string, bytes int64) (cuda.DevicePtr, error) { return c.Scratch("embedding."+name, bytes) }
	var bufs [4]cuda.DevicePtr // keys A, vals A, keys B, vals B
	for i, name := range []string{"keys0", "vals0", "keys1", "vals1"} {
		p, err := ptr(name, int64(n)*4)
		if err != nil {
			return err
		}
		bufs[i] = p
	}
	hist, err := ptr("hist", int64(256*tiles)*4)
	if err != nil {
		return err
	}
	partial, err := ptr("partial", int64(chunks)*2*int64(cols)*4)
	if err != nil {
		return err
	}
	// Keys are in [0, V] (V: an invalid index): bits(V) bits, 8 a pass.
	passes := 0
	for b := v; b > 0; b >>= 8 {
		passes++
	}
	var inK, inV cuda.DevicePtr
	cur := 0
	for p := 0; p < passes; p++ {
		first := p == 0
		shift := 8 * p
		outK, outV := bufs[2*cur], bufs[2*cur+1]
		if err := launch.EmbedSortHist(c, grid1(tiles), block1(256), 0,
			hist, inK, devPtr(idx), int32(n), int32(v), int32(shift), int32(tiles), launch.Bool(first)); err != nil {
			return err
		}
		if err := launch.EmbedSortScan(c, grid1(1), block1(1024), 0, hist, int32(256*tiles)); err != nil {
			return err
		}
		if err := launch.EmbedSortScatter(c, grid1(tiles), block1(256), 0,
			outK, outV, inK, inV, devPtr(idx), hist, int32(n), int32(v),
			int32(shift), int32(tiles), launch.Bool(first)); err != nil {
			return err
		}
		inK, inV = outK, outV
		cur = 1 - cur
	}
	vec := 1
	if cols%4 == 0 && vecAligned(dy, 4, ldOf(dy)) && vecAligned(dtable, 4) {
		vec = 4
	}
	threads := min((cols/vec+31)/32*32, 256)
	colBlocks := (cols/vec + threads - 1) / threads
	grid := [3]uint32{uint32(chunks), uint32(colBlocks), 1}
	if err := launch.EmbedBwdChunk(c, dtName(dy.DType)+dtSuffix(dtable.DType), grid, block1(threads), 0,
		devPtr(dtable), devPtr(dy), int64(ldOf(dy)), inK, inV, partial,
		int32(n), int32(cols), int32(v), int32(vec)); err != nil {
		return err
	}
	spanGrid := [3]uint32{uint32(chunks), uint32((cols + 31) / 32), 1}
	return launch.EmbedBwdSpan(c, dtName(dtable.DType), spanGrid, [3]uint32{32, 8, 1}, 0,
		devPtr(dtable), inK, partial, int32(n), int32(cols), int32(v))
}

// zero clears a contiguous f32 or bf16 tensor: a 32-bit memset where the
// size and address allow (a memset node in a captured graph), else
// embed_zero_bf16.
func (c *cudaImpl) zero(t *tensor.Tensor) error {
	b := t.Bytes()
	if b == 0 {
		return nil
	}
	if b%4 == 0 && t.Ptr()%4 == 0 {
		return cuda.MemsetD32Async(devPtr(t), 0, b/4, c.Stream())
	}
	n := t.Numel()
	return launch.EmbedZeroBf16(c, grid1(min(n/256+1, 65535)), block1(256), 0, devPtr(t), int64(n))

}

// ---- graph ----

// Embedding records y = table[idx] (Engine.Embedding): table [V, C] a
// Param (f32 master weights, read directly — no cast), idx an Input of
// i32 indices of any shape, y of shape idx.shape + [C] in the graph's
// activation dtype. The backward scatter-adds into table's gradient,
// accumulating when the table has other consumers (a language-model head
// tied to the token embedding).
func (g *Graph) Embedding(table, idx *Var) *Var {
	if !g.ok(table, idx) {
		return nil
	}
	g.prefetch("embedding.cu")
	if table.Value.Rank() != 2 || idx.Value.DType != tensor.I32 {
		g.Fail("embedding", fmt.Errorf("%w: table %v %v, idx %v %v", tensor.ErrShape,
			table.Value.Shape, table.Value.DType, idx.Value.Shape, idx.Value.DType))
		return nil
	}
	shape := append(append([]int(nil), idx.Value.Shape...), table.Value.Dim(1))
	y := g.NewOut("embedding", g.ActDType(), shape...)
	e := g.e
	g.Record("embedding", []*Var{table, idx}, []*Var{y}, func(*Grads) error {
		return e.Embedding(y.Value, table.Value, idx.Value)
	}, func(gr *Grads) error {
		dy, dt := gr.Out(0), gr.In(0)
		switch {
		case dt == nil:
			return nil
		case dy == nil && gr.Acc(0):
			return nil
		case dy == nil:
			return e.Fill(dt, 0) // a zero upstream gradient
		}
		return e.EmbeddingBackward(dt, dy, idx.Value, gr.Acc(0))
	})
	return y
}
