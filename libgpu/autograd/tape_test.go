package autograd

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func TestTapeOrder(t *testing.T) {
	var tp Tape
	var log []string
	rec := func(s string) Func { return func(*ops.Engine) error { log = append(log, s); return nil } }
	tp.Record("a", rec("fa"), rec("ba"))
	tp.Record("b", rec("fb"), nil)
	tp.Record("c", rec("fc"), rec("bc"))
	if tp.Len() != 3 {
		t.Fatalf("Len %d, want 3", tp.Len())
	}
	for step := 0; step < 2; step++ {
		log = log[:0]
		if err := tp.Forward(nil); err != nil {
			t.Fatal(err)
		}
		if err := tp.Backward(nil); err != nil {
			t.Fatal(err)
		}
		if want := []string{"fa", "fb", "fc", "bc", "ba"}; !slices.Equal(log, want) {
			t.Fatalf("step %d ran %v, want %v", step, log, want)
		}
	}
}

func TestTapeBackwardNeedsForward(t *testing.T) {
	var tp Tape
	tp.Record("a", func(*ops.Engine) error { return nil }, func(*ops.Engine) error { return nil })
	if err := tp.Backward(nil); !errors.Is(err, ErrNoForward) {
		t.Fatalf("backward first: %v, want ErrNoForward", err)
	}
	if err := tp.Forward(nil); err != nil {
		t.Fatal(err)
	}
	if err := tp.Backward(nil); err != nil {
		t.Fatal(err)
	}
	if err := tp.Backward(nil); !errors.Is(err, ErrNoForward) {
		t.Fatalf("second backward: %v, want ErrNoForward", err)
	}
}

func TestTapeErrorsNameTheNode(t *testing.T) {
	boom := errors.New("boom")
	var tp Tape
	tp.Record("fc3", func(*ops.Engine) error { return boom }, nil)
	err := tp.Forward(nil)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "fc3") {
		t.Fatalf("error %v, want wrapped boom naming fc3", err)
	}
	if err := tp.Backward(nil); !errors.Is(err, ErrNoForward) {
		t.Fatalf("backward after failed forward: %v, want ErrNoForward", err)
	}
}

func TestTapeRecordChecks(t *testing.T) {
	v := func(grad bool) *Var {
		x := &tensor.Tensor{}
		if grad {
			return NewVar(x, &tensor.Tensor{})
		}
		return NewVar(x, nil)
	}
	var tp Tape
	x, w, b, y := v(true), v(true), v(true), v(true)
	if err := tp.Linear("l0", y, x, w, b, nil, ops.ActReLU); err != nil {
		t.Fatal(err)
	}
	// x is consumed a second time: its gradient would be overwritten.
	if err := tp.Linear("l1", v(true), x, v(true), nil, nil, ops.ActNone); !errors.Is(err, ErrFanOut) {
		t.Fatalf("second consumer: %v, want ErrFanOut", err)
	}
	// Inputs without gradients may be shared.
	in := v(false)
	for i := 0; i < 2; i++ {
		if err := tp.Linear("shared", v(true), in, v(true), nil, nil, ops.ActNone); err != nil {
			t.Fatal(err)
		}
	}
	if err := tp.Linear("gelu", v(true), v(true), v(true), nil, nil, ops.ActGELU); !errors.Is(err, ErrArg) {
		t.Fatalf("GELU without aux: %v, want ErrArg", err)
	}
	if err := tp.Linear("nograd", v(true), v(true), v(false), nil, nil, ops.ActNone); !errors.Is(err, ErrArg) {
		t.Fatalf("weight without grad: %v, want ErrArg", err)
	}
	if err := tp.SoftmaxCrossEntropy("ce", &tensor.Tensor{}, y, nil); !errors.Is(err, ErrArg) {
		t.Fatalf("no labels: %v, want ErrArg", err)
	}
}
