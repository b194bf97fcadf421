package main

import "testing"

// TestBusBW: nccl-tests' bus bandwidths (PERFORMANCE.md): an all-reduce's
// algbw·2(n−1)/n, equal to algbw on 2 ranks, 1.75× on 8; a reduce-
// scatter's and an all-gather's algbw·(n−1)/n, half of it.
func TestBusBW(t *testing.T) {
	for _, c := range []struct {
		op        string
		ranks     int
		alg, want float64
	}{{"allreduce", 1, 100, 0}, {"allreduce", 2, 100, 100}, {"allreduce", 4, 100, 150}, {"allreduce", 8, 100, 175},
		{"reducescatter", 2, 100, 50}, {"reducescatter", 4, 100, 75}, {"allgather", 8, 100, 87.5}} {
		if got := BusBW(c.op, c.alg, c.ranks); got != c.want {
			t.Errorf("BusBW(%s, %v, %d) = %v, want %v", c.op, c.alg, c.ranks, got, c.want)
		}
	}
	if k := Key("allreduce", 256<<20, "f32", 2, "graph"); k != "allreduce bytes=268435456 dtype=f32 ranks=2 mode=graph" {
		t.Errorf("key %q", k)
	}
}
