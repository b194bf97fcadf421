package main

import "testing"

// TestBusBW: nccl-tests' all-reduce bus bandwidth (PERFORMANCE.md):
// algbw·2(n−1)/n, equal to algbw on 2 ranks, 1.75× on 8.
func TestBusBW(t *testing.T) {
	for _, c := range []struct {
		ranks     int
		alg, want float64
	}{{1, 100, 0}, {2, 100, 100}, {4, 100, 150}, {8, 100, 175}} {
		if got := BusBW(c.alg, c.ranks); got != c.want {
			t.Errorf("BusBW(%v, %d) = %v, want %v", c.alg, c.ranks, got, c.want)
		}
	}
	if k := Key(256<<20, "f32", 2, "graph"); k != "allreduce bytes=268435456 dtype=f32 ranks=2 mode=graph" {
		t.Errorf("key %q", k)
	}
}
