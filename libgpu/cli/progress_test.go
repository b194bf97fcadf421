package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestProgressDrawsOnlyWhenAllowed(t *testing.T) {
	var b bytes.Buffer
	t.Setenv(ProgressEnv, "auto")
	if p := NewProgress(&b, 10, "train", "step"); p != nil {
		t.Fatalf("auto drew on a buffer (not a terminal)")
	}
	var nilp *Progress
	nilp.Set(3, "x") // a nil bar is valid
	nilp.Add(1)
	nilp.Done()

	t.Setenv(ProgressEnv, "never")
	if p := NewProgress(&b, 10, "train", "step"); p != nil {
		t.Fatalf("never drew")
	}

	t.Setenv(ProgressEnv, "always")
	p := NewProgress(&b, 10, "train", "step")
	if p == nil {
		t.Fatalf("always drew nothing")
	}
	p.Set(5, "loss 1.25")
	p.Done()
	out := b.String()
	for _, want := range []string{"train loss 1.25", "5/10", "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("bar %q lacks %q", out, want)
		}
	}
}
