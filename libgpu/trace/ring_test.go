package trace

import (
	"sync"
	"testing"
)

// TestRingConcurrent: records put by several producers come out exactly once,
// in each producer's order, while a consumer drains concurrently.
func TestRingConcurrent(t *testing.T) {
	r := newRing(64)
	const producers, each = 4, 20000
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				rec := Record{Track: uint32(p), Start: int64(i)}
				if r.put(&rec) {
					i++
				}
			}
		}()
	}
	next := make([]int64, producers)
	got := 0
	var rec Record
	for got < producers*each {
		if !r.get(&rec) {
			continue
		}
		if rec.Start != next[rec.Track] {
			t.Fatalf("producer %d: got %d, want %d", rec.Track, rec.Start, next[rec.Track])
		}
		next[rec.Track]++
		got++
	}
	wg.Wait()
	if r.get(&rec) {
		t.Fatal("ring not empty")
	}
}

func TestRingFull(t *testing.T) {
	r := newRing(5) // rounds up to 8
	rec := Record{Name: "x"}
	n := 0
	for r.put(&rec) {
		n++
	}
	if n != 8 || r.len() != 8 {
		t.Fatalf("held %d (len %d), want 8", n, r.len())
	}
	if !r.get(&rec) || !r.put(&rec) || r.put(&rec) {
		t.Fatal("one get should make room for exactly one put")
	}
}
