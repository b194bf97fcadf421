package driver

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/trace"
)

// TestRunnerPostPhases: with phases, post runs eagerly at a phase's first
// step and at steps of phase −1, is captured at the phase's second step
// (its host side ran by the capture, so no Replayed) and replayed after,
// each replay followed by Replayed. On the host a "graph" is the function
// itself (exec.Engine.Capture), so the runner is forced into graph mode to
// see its protocol; every call of post is one step's work either way.
func TestRunnerPostPhases(t *testing.T) {
	e, err := ops.NewEngine(device.NewHost(), ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRunner(e, nil, func(*trace.GPUTimer) error { return nil }, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.graph = true
	phases := []int{-1, 0, 0, 0, -1, 1, 1, 0, 1, -1, 1}
	step, posts, replays := 0, 0, 0
	r.SetPost(func(*trace.GPUTimer) error { posts++; return nil })
	r.SetPostPhases(func() int { return phases[step] }, func() { replays++ })
	for step = range phases {
		if _, err := r.Stage(); err != nil {
			t.Fatal(err)
		}
		if err := r.Run(); err != nil {
			t.Fatal(err)
		}
	}
	// Phase 0 at steps 1 (eager), 2 (captured), 3 and 7 (replayed); phase 1
	// at 5 (eager), 6 (captured), 8 and 10 (replayed).
	if posts != len(phases) || replays != 4 || len(r.postGraphs.graphs) != 2 {
		t.Fatalf("%d posts, %d replays, %d graphs; want %d, 4, 2", posts, replays, len(r.postGraphs.graphs), len(phases))
	}
}

// TestRunnerComputePhases: with compute phases, a phase's first step runs
// eagerly, later ones from a graph per slot and phase (captured at the
// slot's first such step), and phase −1 always eagerly; every step's
// compute runs once either way.
func TestRunnerComputePhases(t *testing.T) {
	e, err := ops.NewEngine(device.NewHost(), ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	r, err := NewRunner(e, nil, func(*trace.GPUTimer) error { calls++; return nil }, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.graph = true
	phases := []int{-1, 0, 0, 0, 1, 1, 1, 0, -1, 1}
	step := 0
	r.SetComputePhases(func() int { return phases[step] })
	for step = range phases {
		if _, err := r.Stage(); err != nil {
			t.Fatal(err)
		}
		if err := r.Run(); err != nil {
			t.Fatal(err)
		}
	}
	// Phase 0: step 1 eager, 2 (slot 0) and 3 (slot 1) captured, 7 (slot
	// 1) replayed; phase 1: 4 eager, 5 (slot 1) and 6 (slot 0) captured, 9
	// (slot 1) replayed.
	if calls != len(phases) || len(r.cgraphs.graphs) != 4 || len(r.cgraphs.seen) != 2 {
		t.Fatalf("%d computes, %d graphs, %d phases seen; want %d, 4, 2", calls, len(r.cgraphs.graphs), len(r.cgraphs.seen), len(phases))
	}
}
