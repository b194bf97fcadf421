package opstest

import "testing"

// TestDriftBound: the floor rules while the twin agrees; a difference
// beyond it fails even after the twin has drifted less; the bound follows
// the twin's running maximum, which never shrinks.
func TestDriftBound(t *testing.T) {
	d := DriftBound{Floor: 1e-4}
	for i, c := range []struct {
		ours, twin, bound float64
		ok                bool
	}{
		{5e-5, 1e-9, 1e-4, true},  // rounding on both sides
		{2e-4, 1e-8, 1e-4, false}, // a real difference at once
		{1e-4, 1e-4, 4e-4, true},  // the running maximum 2e-4 within 4·1e-4
		{1e-3, 1e-6, 4e-4, false}, // the twin's maximum stays 1e-4
		{1e-3, 5e-4, 2e-3, true},  // the twin drifted: the bound grew
		{9e-3, 1e-5, 2e-3, false}, // not past DriftFactor × the twin
	} {
		bound, ok := d.Step(c.ours, c.twin)
		if bound != c.bound || ok != c.ok {
			t.Errorf("step %d (%g, %g): bound %g ok %v, want %g %v", i+1, c.ours, c.twin, bound, ok, c.bound, c.ok)
		}
	}
}
