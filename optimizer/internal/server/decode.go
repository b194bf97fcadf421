package server

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/pool"
)

// The server's decoding of request bodies (the client encodes with
// msgpack's reflection). A body is read as generic msgpack values and each
// field is taken with its JSON-like leniency: a float setting may be any
// msgpack number (float32, float64 — Python's and JavaScript's default —
// or an integer), an integer may be an integral float; anything else of
// the wrong type, or a number out of range, is an error naming the field
// ("params[2].value.shape[1]"). Unknown keys are ignored; an absent or nil
// key takes its default. Everything that sizes memory is checked with
// overflow-safe arithmetic before it is used.

// field is a decoded msgpack value and where it sits in the request.
type field struct {
	v    any
	path string
}

func (f field) at(key string) field {
	m, _ := f.v.(map[string]any)
	p := key
	if f.path != "" {
		p = f.path + "." + key
	}
	return field{v: m[key], path: p}
}

func (f field) index(i int) field {
	a, _ := f.v.([]any)
	var v any
	if i < len(a) {
		v = a[i]
	}
	return field{v: v, path: f.path + "[" + strconv.Itoa(i) + "]"}
}

func (f field) absent() bool { return f.v == nil }

func (f field) errf(format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ipc.ErrBadRequest, f.path, fmt.Sprintf(format, args...))
}

func (f field) typeErr(want string) error {
	return fmt.Errorf("%w: %s: want %s, got %s", ipc.ErrMalformed, f.path, want, kind(f.v))
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "nil"
	case bool:
		return "a bool"
	case int64, uint64:
		return "an integer"
	case float32, float64:
		return "a float"
	case string:
		return "a str"
	case []byte:
		return "a bin"
	case []any:
		return "an array"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("%T", v)
}

func (f field) isMap() bool { _, ok := f.v.(map[string]any); return ok }

func (f field) str(maxLen int) (string, error) {
	if f.absent() {
		return "", nil
	}
	s, ok := f.v.(string)
	if !ok {
		return "", f.typeErr("a str")
	}
	if len(s) > maxLen {
		return "", f.errf("%d bytes (at most %d)", len(s), maxLen)
	}
	if !utf8.ValidString(s) {
		return "", f.errf("not UTF-8")
	}
	return s, nil
}

// name is a run or parameter name: 1 to MaxNameLen bytes of UTF-8, no
// control characters, no "/" in a parameter name's path segments that are
// empty, "." or "..".
func (f field) name() (string, error) {
	s, err := f.str(service.MaxNameLen)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", f.errf("empty")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "", f.errf("%q has a control character", s)
		}
	}
	return s, nil
}

func (f field) float64() (float64, bool, error) {
	switch x := f.v.(type) {
	case nil:
		return 0, false, nil
	case float64:
		return x, true, nil
	case float32:
		return float64(x), true, nil
	case int64:
		return float64(x), true, nil
	case uint64:
		return float64(x), true, nil
	}
	return 0, false, f.typeErr("a number")
}

// float32 reads a number into *dst (left alone when absent). Finite values
// beyond float32's range are refused; NaN and infinities pass, for the
// range checks that name them.
func (f field) float32(dst *float32) error {
	x, ok, err := f.float64()
	if err != nil || !ok {
		return err
	}
	if !math.IsInf(x, 0) && !math.IsNaN(x) && math.Abs(x) > math.MaxFloat32 {
		return f.errf("%g is beyond float32's range", x)
	}
	*dst = float32(x)
	return nil
}

// int64 reads an integer (or an integral float) in [lo, hi].
func (f field) int64(lo, hi int64) (int64, bool, error) {
	var n int64
	switch x := f.v.(type) {
	case nil:
		return 0, false, nil
	case int64:
		n = x
	case uint64:
		if x > math.MaxInt64 {
			return 0, false, f.errf("%d is out of range (%d to %d)", x, lo, hi)
		}
		n = int64(x)
	case float64, float32:
		v, _, _ := f.float64()
		if v != math.Trunc(v) || v < -(1<<63) || v >= 1<<63 {
			return 0, false, f.errf("%v is not an integer", v)
		}
		n = int64(v)
	default:
		return 0, false, f.typeErr("an integer")
	}
	if n < lo || n > hi {
		return 0, false, f.errf("%d is out of range (%d to %d)", n, lo, hi)
	}
	return n, true, nil
}

func (f field) int(dst *int, lo, hi int64) error {
	n, ok, err := f.int64(lo, hi)
	if ok {
		*dst = int(n)
	}
	return err
}

func (f field) bool(dst *bool) error {
	switch x := f.v.(type) {
	case nil:
		return nil
	case bool:
		*dst = x
		return nil
	}
	return f.typeErr("a bool")
}

func (f field) array() ([]any, error) {
	switch x := f.v.(type) {
	case nil:
		return nil, nil
	case []any:
		return x, nil
	}
	return nil, f.typeErr("an array")
}

func (f field) bin() ([]byte, error) {
	switch x := f.v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return x, nil
	case string:
		// DecodeInterfaceLoose (decodeBody) turns msgpack bin into a
		// string, so a bin arrives here as one; a str is taken the same
		// way (its bytes).
		return []byte(x), nil
	}
	return nil, f.typeErr("a bin")
}

// decodeBody reads a request body as generic msgpack values (nil for an
// empty body). The body passed ipc.Validate (one value, depth at most
// ipc.MaxDepth, lengths within the frame), so this is bounded by the
// frame's 128 KiB.
func decodeBody(body []byte) (field, error) {
	if len(body) == 0 {
		return field{}, nil
	}
	if err := ipc.Validate(body); err != nil {
		return field{}, err
	}
	d := msgpack.NewDecoder(bytes.NewReader(body))
	d.UseLooseInterfaceDecoding(true)
	v, err := d.DecodeInterfaceLoose()
	if err != nil {
		return field{}, fmt.Errorf("%w: body: %v", ipc.ErrMalformed, err)
	}
	f := field{v: v}
	if !f.isMap() && v != nil {
		return field{}, fmt.Errorf("%w: body: want a map, got %s", ipc.ErrMalformed, kind(v))
	}
	return f, nil
}

// DecodeRegister reads a register body (PROTOCOL.md) as the service does.
// Errors wrap ipc.ErrMalformed (wrong types), ipc.ErrBadRequest (values
// out of range) or optim.ErrConfig (an unknown optimizer), and name the
// field.
func DecodeRegister(body []byte) (*service.RegisterRequest, error) {
	f, err := decodeBody(body)
	if err != nil {
		return nil, err
	}
	req := &service.RegisterRequest{}
	if req.Run, err = f.at("run").name(); err != nil {
		return nil, err
	}
	if req.Spec, err = decodeSpec(f.at("spec")); err != nil {
		return nil, err
	}
	params, err := f.at("params").array()
	if err != nil {
		return nil, err
	}
	for i := range params {
		pf := f.at("params").index(i)
		if !pf.isMap() {
			return nil, pf.typeErr("a map")
		}
		var p service.ParamRef
		if p.Name, err = pf.at("name").name(); err != nil {
			return nil, err
		}
		if p.Value, err = decodeTensor(pf.at("value")); err != nil {
			return nil, err
		}
		if p.Grad, err = decodeTensor(pf.at("grad")); err != nil {
			return nil, err
		}
		req.Params = append(req.Params, p)
	}
	layers, err := f.at("layers").array()
	if err != nil {
		return nil, err
	}
	for i := range layers {
		lf := f.at("layers").index(i)
		if !lf.isMap() {
			return nil, lf.typeErr("a map")
		}
		var l service.LayerRef
		if l.Weight, err = lf.at("weight").name(); err != nil {
			return nil, err
		}
		if b := lf.at("bias"); !b.absent() {
			if l.Bias, err = b.name(); err != nil {
				return nil, err
			}
		}
		for _, x := range []struct {
			key string
			dst **service.TensorRef
		}{{"input", &l.Input}, {"out_grad", &l.OutGrad}} {
			if tf := lf.at(x.key); !tf.absent() {
				t, err := decodeTensor(tf)
				if err != nil {
					return nil, err
				}
				*x.dst = &t
			}
		}
		req.Layers = append(req.Layers, l)
	}
	if req.Event, err = f.at("event").bin(); err != nil {
		return nil, err
	}
	if n := len(req.Event); n != 0 && n != service.EventHandleSize {
		return nil, fmt.Errorf("%w: event: want %d bytes (a CUDA interprocess event handle), got %d", ipc.ErrMalformed, service.EventHandleSize, n)
	}
	if sf := f.at("lr_scale"); !sf.absent() {
		t, err := decodeTensor(sf)
		if err != nil {
			return nil, err
		}
		req.LRScale = &t
	}
	return req, nil
}

// decodeTensor reads a tensor reference and checks what can be checked
// before its buffer is open: a buffer name, a known dtype, at most MaxDims
// dimensions, none negative, an element count and byte span (offset
// included) that do not overflow and are at most MaxTensorBytes, and an
// aligned offset.
func decodeTensor(f field) (service.TensorRef, error) {
	var r service.TensorRef
	if !f.isMap() {
		return r, f.typeErr("a tensor map {buffer, offset, dtype, shape}")
	}
	var err error
	if r.Buffer, err = f.at("buffer").str(pool.MaxNameLen); err != nil {
		return r, err
	}
	if r.Buffer == "" {
		return r, f.at("buffer").errf("empty")
	}
	// Numbers are read whole and their ranges checked by span, so a bad
	// one is optimizer.bad_tensor like any other bad reference.
	if r.Offset, _, err = f.at("offset").int64(math.MinInt64, math.MaxInt64); err != nil {
		return r, asTensor(err)
	}
	if r.DType, err = f.at("dtype").str(pool.MaxDTypeLen); err != nil {
		return r, err
	}
	shape, err := f.at("shape").array()
	if err != nil {
		return r, err
	}
	if len(shape) > service.MaxDims {
		return r, f.at("shape").errf("%d dimensions (at most %d)", len(shape), service.MaxDims)
	}
	for i := range shape {
		d, _, err := f.at("shape").index(i).int64(math.MinInt64, math.MaxInt64)
		if err != nil {
			return r, asTensor(err)
		}
		r.Shape = append(r.Shape, d)
	}
	if _, _, _, err := r.Check(f.path); err != nil {
		return r, err
	}
	return r, nil
}

// asTensor makes a number's range error (an integer past int64, a
// fraction) an ErrTensor; a wrong type stays malformed.
func asTensor(err error) error {
	if errors.Is(err, ipc.ErrBadRequest) {
		return fmt.Errorf("%w: %s", service.ErrTensor, strings.TrimPrefix(err.Error(), ipc.ErrBadRequest.Error()+": "))
	}
	return err
}

// decodeSpec reads an optimizer's settings: name first, then every key
// given over optim.Defaults(name).
func decodeSpec(f field) (optim.Spec, error) {
	if !f.isMap() {
		return optim.Spec{}, f.typeErr("a map")
	}
	name, err := f.at("name").str(32)
	if err != nil {
		return optim.Spec{}, err
	}
	s, err := optim.Defaults(name)
	if err != nil {
		return optim.Spec{}, fmt.Errorf("%w (%s)", err, f.at("name").path)
	}
	for _, x := range []struct {
		key string
		dst *float32
	}{{"lr", &s.LR}, {"weight_decay", &s.WeightDecay}, {"beta1", &s.Beta1}, {"beta2", &s.Beta2}, {"eps", &s.Eps},
		{"momentum", &s.Momentum}, {"graft_beta2", &s.GraftBeta2}, {"graft_eps", &s.GraftEps}, {"matrix_eps", &s.MatrixEps},
		{"rel_eps", &s.RelEps}, {"adam_lr", &s.AdamLR}, {"damping", &s.Damping}, {"stat_decay", &s.StatDecay}, {"kl_clip", &s.KLClip}} {
		if err := f.at(x.key).float32(x.dst); err != nil {
			return s, err
		}
	}
	for _, x := range []struct {
		key string
		dst *int
	}{{"max_block", &s.MaxBlock}, {"update_freq", &s.UpdateFreq}, {"start_step", &s.StartStep}, {"newton_iters", &s.NewtonIters},
		{"max_staleness", &s.MaxStaleness}, {"cov_every", &s.CovEvery}} {
		if err := f.at(x.key).int(x.dst, math.MinInt32, math.MaxInt32); err != nil {
			return s, err
		}
	}
	for _, x := range []struct {
		key string
		dst *string
	}{{"graft", &s.Graft}, {"root", &s.Root}} {
		if v := f.at(x.key); !v.absent() {
			if *x.dst, err = v.str(32); err != nil {
				return s, err
			}
		}
	}
	if err := f.at("async").bool(&s.Async); err != nil {
		return s, err
	}
	ex := f.at("exclude")
	subs, err := ex.array()
	if err != nil {
		return s, err
	}
	if subs != nil {
		s.Exclude = []string{}
		for i := range subs {
			v, err := ex.index(i).str(service.MaxNameLen)
			if err != nil {
				return s, err
			}
			s.Exclude = append(s.Exclude, v)
		}
	}
	if err := s.Check(); err != nil {
		return s, fmt.Errorf("%w (%s)", err, f.path)
	}
	return s, nil
}

// DecodeStep reads a step body: lr, when given and not 0, a finite number
// of float32's range that is not negative.
func DecodeStep(body []byte) (service.StepRequest, error) {
	if r, ok := parseStep(body); ok {
		return r, nil
	}
	f, err := decodeBody(body)
	if err != nil {
		return service.StepRequest{}, err
	}
	var r service.StepRequest
	lr := f.at("lr")
	if err := lr.float32(&r.LR); err != nil {
		return r, err
	}
	if x := float64(r.LR); x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return r, lr.errf("%v (want a finite learning rate, at least 0)", r.LR)
	}
	return r, nil
}

// parseStep reads the step bodies the Go client sends — none, {} or
// {lr: float32} — without allocating (a step is the hot path); anything
// else is left to DecodeStep's general reading (ok false).
func parseStep(b []byte) (service.StepRequest, bool) {
	switch {
	case len(b) == 0 || (len(b) == 1 && b[0] == 0x80):
		return service.StepRequest{}, true
	case len(b) == 9 && b[0] == 0x81 && b[1] == 0xa2 && b[2] == 'l' && b[3] == 'r' && b[4] == 0xca:
		lr := math.Float32frombits(uint32(b[5])<<24 | uint32(b[6])<<16 | uint32(b[7])<<8 | uint32(b[8]))
		if lr >= 0 && !math.IsInf(float64(lr), 0) { // NaN fails the first test
			return service.StepRequest{LR: lr}, true
		}
	}
	return service.StepRequest{}, false
}
