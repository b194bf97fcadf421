package zero

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// ErrState: an optimizer's state cannot be gathered or split per
// parameter (Owned.GatherState, LoadState).
var ErrState = errors.New("zero: optimizer state not per parameter")

// Cost is the default cost of owning a parameter in Assign: the work of a
// matrix method's update of an m×n matrix (m = the first dimension, n the
// rest), m·n·min(m, n) — the order of Shampoo's and SOAP's per-block
// statistics and of Muon's Newton–Schulz products — and n for a vector.
func Cost(p nn.Param) float64 {
	s := p.Value.Shape
	if len(s) < 2 {
		return float64(p.Value.Numel())
	}
	m, n := s[0], p.Value.Numel()/s[0]
	return float64(m) * float64(n) * float64(min(m, n))
}

// Assign gives each parameter an owner among n ranks: in order of
// decreasing cost (ties: the earlier parameter first), each to the rank
// with the least cost so far (ties: the lower rank) — the greedy
// longest-processing-time rule Distributed Shampoo uses to balance its
// blocks across ranks (Shi et al., "A Distributed Data-Parallel PyTorch
// Implementation of the Distributed Shampoo Optimizer for Training Neural
// Networks At-Scale", arXiv 2309.06497, §3). Deterministic, so every rank
// computes the same owners. cost nil: Cost.
func Assign(params []nn.Param, n int, cost func(nn.Param) float64) []int {
	if cost == nil {
		cost = Cost
	}
	order := make([]int, len(params))
	cs := make([]float64, len(params))
	for i, p := range params {
		order[i], cs[i] = i, cost(p)
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cs[b], cs[a]) })
	load := make([]float64, n)
	owner := make([]int, len(params))
	for _, i := range order {
		r := 0
		for k := 1; k < n; k++ {
			if load[k] < load[r] {
				r = k
			}
		}
		owner[i] = r
		load[r] += cs[i]
	}
	return owner
}

// Owned is ZeRO-1 for optimizers that update each parameter from its
// whole gradient (see the package doc): this rank's optimizer (built by
// the caller over the parameters Assign gives it) holds their state only
// and updates them only; Step then broadcasts every parameter from its
// owner. The gradients must be all-reduced whole before Step (the
// reducer in its usual mode), and gradient clipping needs nothing new
// (every rank holds every gradient). Results are those of the optimizer
// over all parameters on one rank, as long as its update of a parameter
// depends on that parameter's gradient and state only — true of AdamW,
// SGD, Muon, Shampoo and SOAP; not of K-FAC with KL clipping (one
// coefficient over every layer).
type Owned struct {
	c      Collective
	inner  optim.Optimizer
	params []nn.Param
	owner  []int
}

// NewOwned assigns params to c's ranks (Assign with cost) and builds this
// rank's optimizer with build over the parameters it owns (in params'
// order). Errors: ErrConfig when a rank owns nothing (more ranks than
// parameters); build's.
func NewOwned(c Collective, params []nn.Param, cost func(nn.Param) float64, build func(owned []nn.Param) (optim.Optimizer, error)) (*Owned, error) {
	owner := Assign(params, c.Size(), cost)
	var mine []nn.Param
	count := make([]int, c.Size())
	for i, p := range params {
		count[owner[i]]++
		if owner[i] == c.Rank() {
			mine = append(mine, p)
		}
	}
	for r, k := range count {
		if k == 0 {
			return nil, fmt.Errorf("%w: rank %d of %d owns no parameter (%d parameters)", ErrConfig, r, c.Size(), len(params))
		}
	}
	inner, err := build(mine)
	if err != nil {
		return nil, err
	}
	return &Owned{c: c, inner: inner, params: params, owner: owner}, nil
}

// Owner is the rank that owns parameter i.
func (o *Owned) Owner(i int) int { return o.owner[i] }

// Inner is this rank's optimizer (over its own parameters).
func (o *Owned) Inner() optim.Optimizer { return o.inner }

// Step queues this rank's optimizer step, then the broadcast of every
// parameter from its owner, grouped. A collective.
func (o *Owned) Step(e *ops.Engine) error {
	if err := o.inner.Step(e); err != nil {
		return err
	}
	if o.c.Size() == 1 {
		return nil
	}
	return o.c.Group(e, func() error {
		for i, p := range o.params {
			if err := o.c.Broadcast(e, p.Value, nil, o.owner[i]); err != nil {
				return fmt.Errorf("zero: broadcasting %s from rank %d: %w", p.Name, o.owner[i], err)
			}
		}
		return nil
	})
}

// SetLR implements optim.Optimizer.
func (o *Owned) SetLR(lr float32) { o.inner.SetLR(lr) }

// Reset implements optim.Optimizer.
func (o *Owned) Reset(e *ops.Engine) error { return o.inner.Reset(e) }

// Free implements optim.Optimizer.
func (o *Owned) Free() error { return o.inner.Free() }

// Capturable reports whether Step may be captured: the inner
// optimizer's answer (optim.CanCapture).
func (o *Owned) Capturable() bool { return optim.CanCapture(o.inner) }

// replicated are the state entries that are not per parameter and are the
// same on every rank: the step counters.
var replicated = map[string]bool{"step": true, "adamw.step": true}

// entry is one state tensor of one rank, as the ranks tell each other.
type entry struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Rank  int    `json:"rank"`
	t     *tensor.Tensor
}

// entries sorts this rank's state into per-parameter entries (named
// "<param>.…" after one of its parameters) and replicated ones; anything
// else is ErrState.
func (o *Owned) entries() (own, rep []entry, err error) {
	var names []string
	for i, p := range o.params {
		if o.owner[i] == o.c.Rank() {
			names = append(names, p.Name+".")
		}
	}
	for _, s := range o.inner.State() {
		en := entry{Name: s.Name, DType: s.Value.DType.String(), Shape: s.Value.Shape, Rank: o.c.Rank(), t: s.Value}
		switch {
		case replicated[s.Name]:
			rep = append(rep, en)
		case slices.ContainsFunc(names, func(p string) bool { return strings.HasPrefix(s.Name, p) }):
			own = append(own, en)
		default:
			return nil, nil, fmt.Errorf("%w: %q belongs to no one parameter (state stacked across parameters, such as Shampoo's and SOAP's block statistics, cannot be re-split)",
				ErrState, s.Name)
		}
	}
	return own, rep, nil
}

// GatherState assembles on rank root the state of every rank's optimizer
// under the names an optimizer over all the parameters gives it (per
// parameter "<param>.…", and the step counters, taken from root): host
// tensors the caller frees, nil on the other ranks. A collective: the
// ranks tell each other their entries (two all-gathers through device
// buffers allocated through a), then each entry is broadcast from its
// owner. Errors: ErrState for an optimizer with state stacked across
// parameters (Shampoo, SOAP); communication errors.
func (o *Owned) GatherState(e *ops.Engine, a device.Allocator, root int) (state []nn.Param, err error) {
	if root < 0 || root >= o.c.Size() {
		return nil, fmt.Errorf("%w: gathering the state on rank %d of %d", ErrConfig, root, o.c.Size())
	}
	own, rep, err := o.entries()
	if err != nil {
		return nil, err
	}
	all, err := o.exchange(e, a, own)
	if err != nil {
		return nil, err
	}
	host := device.Local{Dev: device.NewHost()}
	me := o.c.Rank() == root
	defer func() {
		if err != nil {
			for _, s := range state {
				s.Value.Buf.Free()
			}
			state = nil
		}
	}()
	for _, en := range all {
		dt, err := tensor.ParseDType(en.DType)
		if err != nil {
			return state, err
		}
		t := en.t // this rank's own tensor, when it owns the entry
		if t == nil {
			if t, err = tensor.Alloc(a, "", dt, en.Shape...); err != nil {
				return state, err
			}
		}
		err = o.c.Broadcast(e, bytesView(t), nil, en.Rank)
		if err == nil {
			err = e.Sync()
		}
		var raw []byte
		if err == nil && me {
			raw, err = t.Read()
		}
		if en.t == nil {
			t.Buf.Free()
		}
		if err != nil {
			return state, fmt.Errorf("zero: gathering %s from rank %d: %w", en.Name, en.Rank, err)
		}
		if me {
			h, err := tensor.Alloc(host, "", dt, en.Shape...)
			if err != nil {
				return state, err
			}
			state = append(state, nn.Param{Name: en.Name, Value: h})
			if err := h.Write(raw); err != nil {
				return state, err
			}
		}
	}
	if !me {
		return nil, nil
	}
	for _, en := range rep {
		raw, err := en.t.Read()
		if err != nil {
			return state, err
		}
		h, err := tensor.Alloc(host, "", en.t.DType, en.Shape...)
		if err != nil {
			return state, err
		}
		state = append(state, nn.Param{Name: en.Name, Value: h})
		if err := h.Write(raw); err != nil {
			return state, err
		}
	}
	return state, nil
}

// bytesView is t's bytes as a u8 tensor (a broadcast of any dtype).
func bytesView(t *tensor.Tensor) *tensor.Tensor {
	return &tensor.Tensor{Buf: t.Buf, DType: tensor.U8, Shape: []int{int(t.Bytes())}, Strides: []int{1}, Offset: int(t.ByteOffset())}
}

// exchange gives every rank every rank's per-parameter entries, in rank
// order (this rank's own carry their tensors): the lengths of the ranks'
// JSON descriptions, all-gathered as i32, then the descriptions padded to
// the longest, all-gathered as bytes.
func (o *Owned) exchange(e *ops.Engine, a device.Allocator, own []entry) ([]entry, error) {
	js, err := json.Marshal(own)
	if err != nil {
		return nil, err
	}
	n := o.c.Size()
	lens, err := tensor.Alloc(a, "", tensor.I32, n)
	if err != nil {
		return nil, err
	}
	defer lens.Buf.Free()
	mine, err := lens.Rows(o.c.Rank(), o.c.Rank()+1)
	if err != nil {
		return nil, err
	}
	if err := mine.Write(tensor.AsBytes([]int32{int32(len(js))})); err != nil {
		return nil, err
	}
	if err := o.c.AllGather(e, lens, mine); err != nil {
		return nil, err
	}
	if err := e.Sync(); err != nil {
		return nil, err
	}
	raw, err := lens.Read()
	if err != nil {
		return nil, err
	}
	ls := tensor.BytesAs[int32](raw)
	longest := int(slices.Max(ls))
	buf, err := tensor.Alloc(a, "", tensor.U8, n*longest)
	if err != nil {
		return nil, err
	}
	defer buf.Buf.Free()
	part, err := buf.Rows(o.c.Rank()*longest, (o.c.Rank()+1)*longest)
	if err != nil {
		return nil, err
	}
	if err := part.Write(append(js, make([]byte, longest-len(js))...)); err != nil {
		return nil, err
	}
	if err := o.c.AllGather(e, buf, part); err != nil {
		return nil, err
	}
	if err := e.Sync(); err != nil {
		return nil, err
	}
	if raw, err = buf.Read(); err != nil {
		return nil, err
	}
	var all []entry
	for r := range n {
		var es []entry
		if err := json.Unmarshal(raw[r*longest:r*longest+int(ls[r])], &es); err != nil {
			return nil, fmt.Errorf("zero: rank %d's state entries: %w", r, err)
		}
		if r == o.c.Rank() {
			es = own
		}
		all = append(all, es...)
	}
	return all, nil
}

// LoadState sets this rank's optimizer state from whole tensors under the
// names GatherState gives them (those of an optimizer over all the
// parameters, at any world size): load(name, t) fills each of this rank's
// state tensors t. Errors: ErrState as GatherState; load's.
func (o *Owned) LoadState(load func(name string, t *tensor.Tensor) error) error {
	own, rep, err := o.entries()
	if err != nil {
		return err
	}
	for _, en := range append(own, rep...) {
		if err := load(en.Name, en.t); err != nil {
			return fmt.Errorf("zero: loading %s: %w", en.Name, err)
		}
	}
	return nil
}
