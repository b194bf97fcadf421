package server

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
)

func body(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// registerBody is a register request as a client written from PROTOCOL.md
// sends it: a map with float64 settings (Python's and JavaScript's msgpack
// default), value and gradient given by edit.
func registerBody(t testing.TB, edit func(value, grad map[string]any)) []byte {
	value := map[string]any{"buffer": "run/params/w", "dtype": "f32", "shape": []any{4, 4}}
	grad := map[string]any{"buffer": "run/grads/w", "dtype": "f32", "shape": []any{4, 4}}
	if edit != nil {
		edit(value, grad)
	}
	return body(t, map[string]any{
		"run":    "run",
		"spec":   map[string]any{"name": "shampoo", "lr": 0.001, "beta1": 0.9, "max_block": 2.0, "update_freq": 1},
		"params": []any{map[string]any{"name": "w", "value": value, "grad": grad}},
	})
}

// TestDecodeRegisterTakesFloat64 (issue 22, item 7): settings sent as
// msgpack float64, integral floats for integers, and settings left out
// (defaults) are read; Go's own float32 encoding too.
func TestDecodeRegisterTakesFloat64(t *testing.T) {
	req, err := DecodeRegister(registerBody(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	def, _ := optim.Defaults("shampoo")
	s := req.Spec
	if s.LR != 0.001 || s.Beta1 != 0.9 || s.MaxBlock != 2 || s.UpdateFreq != 1 || s.Beta2 != def.Beta2 || s.GraftEps != def.GraftEps {
		t.Fatalf("spec %+v", s)
	}
	if len(req.Params) != 1 || req.Params[0].Value.Shape[1] != 4 {
		t.Fatalf("params %+v", req.Params)
	}
	// The Go client's encoding (float32 settings, every field) reads the same.
	gs := def
	gs.LR, gs.MaxBlock = 0.25, 8
	req2, err := DecodeRegister(body(t, service.RegisterRequest{Run: "r", Spec: gs, Params: []service.ParamRef{{Name: "w",
		Value: service.TensorRef{Buffer: "b", DType: "f32", Shape: []int64{2}}, Grad: service.TensorRef{Buffer: "g", DType: "f32", Shape: []int64{2}}}}}))
	if err != nil || req2.Spec.LR != 0.25 || req2.Spec.MaxBlock != 8 || req2.Spec.Beta2 != def.Beta2 {
		t.Fatalf("Go encoding: %+v %v", req2, err)
	}
	st, err := DecodeStep(body(t, map[string]any{"lr": 0.5}))
	if err != nil || st.LR != 0.5 {
		t.Fatalf("step lr float64: %+v %v", st, err)
	}
	// The Go client's step bodies (the fast path) read the same.
	for _, lr := range []float32{0, 0.25, 3e-4} {
		b, _ := ipc.MarshalBody(service.StepRequest{LR: lr})
		if st, err := DecodeStep(b); err != nil || st.LR != lr {
			t.Fatalf("Go step body lr %v: %+v %v", lr, st, err)
		}
		if _, fast := parseStep(b); !fast {
			t.Fatalf("Go step body lr %v (% x) misses the fast path", lr, b)
		}
	}
}

// TestDecodeRegisterOverflow (issue 22, items 1 and 2): shapes and offsets
// whose sizes would wrap around int64 are refused before anything is
// sized, naming the field.
func TestDecodeRegisterOverflow(t *testing.T) {
	cases := map[string]func(v, g map[string]any){
		"shape [2^32, 2^32]":     func(v, g map[string]any) { v["shape"] = []any{uint64(1) << 32, uint64(1) << 32} },
		"shape [2^62]":           func(v, g map[string]any) { v["shape"] = []any{uint64(1) << 62} },
		"shape of 17 dims":       func(v, g map[string]any) { v["shape"] = make([]any, 17) },
		"negative dim":           func(v, g map[string]any) { v["shape"] = []any{-1, 4} },
		"offset 2^62":            func(v, g map[string]any) { v["offset"] = uint64(1) << 62 },
		"offset 3·2^61":          func(v, g map[string]any) { v["offset"] = uint64(3) << 61 },
		"offset 2^63-1":          func(v, g map[string]any) { v["offset"] = uint64(math.MaxInt64) },
		"offset 2^64-1":          func(v, g map[string]any) { v["offset"] = uint64(math.MaxUint64) },
		"negative offset":        func(v, g map[string]any) { v["offset"] = -64 },
		"unaligned offset":       func(v, g map[string]any) { v["offset"] = 3 },
		"fractional offset":      func(v, g map[string]any) { v["offset"] = 64.5 },
		"span past 1 TiB":        func(v, g map[string]any) { v["shape"] = []any{1 << 20, 1 << 20}; v["offset"] = 64 },
		"unknown dtype":          func(v, g map[string]any) { v["dtype"] = "f128" },
		"dtype a number":         func(v, g map[string]any) { v["dtype"] = 3 },
		"shape a str":            func(v, g map[string]any) { v["shape"] = "4x4" },
		"grad [2^32, 2^32]":      func(v, g map[string]any) { g["shape"] = []any{uint64(1) << 32, uint64(1) << 32} },
		"empty buffer":           func(v, g map[string]any) { v["buffer"] = "" },
		"buffer not UTF-8":       func(v, g map[string]any) { v["buffer"] = "a\xffb" },
		"dim float beyond int64": func(v, g map[string]any) { v["shape"] = []any{1e30} },
	}
	for name, edit := range cases {
		_, err := DecodeRegister(registerBody(t, edit))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !errors.Is(err, service.ErrTensor) && !errors.Is(err, ipc.ErrBadRequest) && !errors.Is(err, ipc.ErrMalformed) {
			t.Errorf("%s: %v is not bad_tensor, bad_request or malformed", name, err)
		}
		if !strings.Contains(err.Error(), "params[0].") {
			t.Errorf("%s: %v does not name the field", name, err)
		}
	}
}

// TestDecodeRegisterNamesFields (issue 22, item 7): bad settings and
// names are refused at register with the field named.
func TestDecodeRegisterNamesFields(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"run":  "run",
			"spec": map[string]any{"name": "adamw"},
			"params": []any{map[string]any{"name": "w",
				"value": map[string]any{"buffer": "v", "dtype": "f32", "shape": []any{4}},
				"grad":  map[string]any{"buffer": "g", "dtype": "f32", "shape": []any{4}}}},
		}
	}
	spec := func(k string, v any) func(m map[string]any) {
		return func(m map[string]any) { m["spec"].(map[string]any)[k] = v }
	}
	cases := []struct {
		field string
		want  error
		edit  func(m map[string]any)
	}{
		{"lr", optim.ErrConfig, spec("lr", math.NaN())},
		{"lr", optim.ErrConfig, spec("lr", -1.0)},
		{"beta1", optim.ErrConfig, spec("beta1", 1.5)},
		{"lr", ipc.ErrBadRequest, spec("lr", 1e300)},
		{"spec.lr", ipc.ErrMalformed, spec("lr", "fast")},
		{"spec.name", optim.ErrConfig, spec("name", "lion")},
		{"spec.async", ipc.ErrMalformed, spec("async", 1)},
		{"spec.max_block", ipc.ErrBadRequest, spec("max_block", uint64(1)<<40)},
		{"run", ipc.ErrBadRequest, func(m map[string]any) { m["run"] = "" }},
		{"run", ipc.ErrBadRequest, func(m map[string]any) { m["run"] = strings.Repeat("r", service.MaxNameLen+1) }},
		{"run", ipc.ErrBadRequest, func(m map[string]any) { m["run"] = "a\nb" }},
		{"params[0].name", ipc.ErrBadRequest, func(m map[string]any) { m["params"].([]any)[0].(map[string]any)["name"] = "" }},
		{"params[0].value", ipc.ErrMalformed, func(m map[string]any) { m["params"].([]any)[0].(map[string]any)["value"] = "v" }},
		{"params[0]", ipc.ErrMalformed, func(m map[string]any) { m["params"] = []any{7} }},
		{"event", ipc.ErrMalformed, func(m map[string]any) { m["event"] = "handle" }},
	}
	for _, c := range cases {
		m := base()
		c.edit(m)
		_, err := DecodeRegister(body(t, m))
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want %v naming it", c.field, err, c.want)
		}
	}
	if _, err := DecodeRegister(body(t, base())); err != nil {
		t.Fatalf("the base request: %v", err)
	}
	for _, lr := range []any{math.NaN(), -1.0, math.Inf(1), "x"} {
		if _, err := DecodeStep(body(t, map[string]any{"lr": lr})); err == nil || !strings.Contains(err.Error(), "lr") {
			t.Errorf("step lr %v: %v", lr, err)
		}
	}
}

// FuzzDecode: the service's decoders never panic, and what they accept
// is within the limits: every tensor's span checked, settings in range.
// The first byte picks the op (even: register, odd: step).
func FuzzDecode(f *testing.F) {
	f.Add(append([]byte{0}, registerBody(f, nil)...))
	f.Add(append([]byte{0}, registerBody(f, func(v, _ map[string]any) { v["shape"] = []any{uint64(1) << 32, uint64(1) << 32} })...))
	f.Add(append([]byte{0}, registerBody(f, func(v, _ map[string]any) { v["offset"] = uint64(3) << 61 })...))
	f.Add(append([]byte{1}, body(f, map[string]any{"lr": 0.5})...))
	f.Add([]byte{1})
	f.Add([]byte{0, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		if b[0]%2 == 1 {
			r, err := DecodeStep(b[1:])
			if err == nil && (r.LR < 0 || r.LR != r.LR || math.IsInf(float64(r.LR), 0)) {
				t.Fatalf("step accepted lr %v", r.LR)
			}
			return
		}
		req, err := DecodeRegister(b[1:])
		if err != nil {
			return
		}
		if req.Run == "" || len(req.Run) > service.MaxNameLen {
			t.Fatalf("run %q accepted", req.Run)
		}
		if err := req.Spec.Check(); err != nil {
			t.Fatalf("spec accepted: %v", err)
		}
		check := func(r service.TensorRef) {
			_, off, n, err := r.Check("t")
			if err != nil || off < 0 || n < 0 || off > service.MaxTensorBytes || n > service.MaxTensorBytes {
				t.Fatalf("tensor %+v accepted: %d %d %v", r, off, n, err)
			}
		}
		for _, p := range req.Params {
			check(p.Value)
			check(p.Grad)
		}
		for _, l := range req.Layers {
			if l.Input != nil {
				check(*l.Input)
			}
			if l.OutGrad != nil {
				check(*l.OutGrad)
			}
		}
		if req.LRScale != nil {
			check(*req.LRScale)
		}
	})
}

// TestDecodeRegisterEvent: the interprocess event handle the Go client
// sends (64 bytes as msgpack bin, on a GPU) reaches the request intact. On
// a GPU machine every register carries one; the host's carry none, which
// is how a decoder that refused bin (DecodeInterfaceLoose turns bin into a
// string) passed every host test and failed every GPU register.
func TestDecodeRegisterEvent(t *testing.T) {
	ev := make([]byte, 64)
	for i := range ev {
		ev[i] = byte(255 - i)
	}
	def, _ := optim.Defaults("adamw")
	b, err := ipc.MarshalBody(service.RegisterRequest{Run: "r", Spec: def, Event: ev, Params: []service.ParamRef{{Name: "w",
		Value: service.TensorRef{Buffer: "b", DType: "f32", Shape: []int64{2}}, Grad: service.TensorRef{Buffer: "g", DType: "f32", Shape: []int64{2}}}}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := DecodeRegister(b)
	if err != nil {
		t.Fatalf("register with an event: %v", err)
	}
	if string(req.Event) != string(ev) {
		t.Fatalf("event % x, sent % x", req.Event, ev)
	}
}
