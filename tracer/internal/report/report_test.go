package report

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gpukit/tracer/internal/chrome"
)

var names = []string{"a", "b", "c", "d"}

// tree adds a span over [lo, hi) with random non-overlapping children and
// returns the span count; self and total accumulate the expected times.
func tree(r *rand.Rand, tr *chrome.Trace, pid, tid uint32, lo, hi float64, depth int, self, total map[string]float64) {
	name := names[r.IntN(len(names))]
	tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: name, Cat: "k", Ts: lo, Dur: hi - lo, Pid: pid, Tid: tid})
	total[name] += hi - lo
	s := hi - lo
	if depth < 3 {
		t := lo
		for t < hi-4 && r.IntN(4) != 0 {
			a := t + float64(r.IntN(int(hi-t)/2+1))
			b := a + float64(1+r.IntN(int(hi-a)))
			if b > hi {
				b = hi
			}
			if a == lo && b == hi { // identical extents would make nesting ambiguous
				b--
			}
			if b <= a {
				break
			}
			tree(r, tr, pid, tid, a, b, depth+1, self, total)
			s -= b - a
			t = b
		}
	}
	self[name] += s
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestTotalsAndSelf: totals and self times match those of the generated trees.
func TestTotalsAndSelf(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	tr := &chrome.Trace{Processes: map[uint32]string{1: "p1", 2: "p2"}}
	self, total := map[string]float64{}, map[string]float64{}
	cursor := map[[2]uint32]float64{} // roots on one track follow each other
	for i := 0; i < 30; i++ {
		pid := uint32(1 + r.IntN(2))
		k := [2]uint32{pid, pid + uint32(r.IntN(3))<<22}
		lo := cursor[k] + float64(r.IntN(1000))
		hi := lo + float64(10+r.IntN(10000))
		cursor[k] = hi
		tree(r, tr, k[0], k[1], lo, hi, 0, self, total)
	}
	rep := Build(tr, 0)
	for _, row := range rep.ByName {
		n := strings.TrimPrefix(row.Key, "k/")
		if !near(row.TotalMS, total[n]/1e3) || !near(row.SelfMS, self[n]/1e3) {
			t.Errorf("%s: total %g self %g, want %g %g", n, row.TotalMS, row.SelfMS, total[n]/1e3, self[n]/1e3)
		}
	}
	if len(rep.ByName) != len(total) {
		t.Errorf("%d names, want %d", len(rep.ByName), len(total))
	}
	for i := 1; i < len(rep.BySelf); i++ {
		if rep.BySelf[i].SelfMS > rep.BySelf[i-1].SelfMS {
			t.Fatal("by_self not sorted")
		}
	}
	var sum float64
	for _, v := range total {
		sum += v
	}
	if len(rep.ByCategory) != 1 || !near(rep.ByCategory[0].TotalMS, sum/1e3) {
		t.Errorf("category %+v, want total %g", rep.ByCategory, sum/1e3)
	}
	if top := Build(tr, 2); len(top.ByName) != 2 || top.ByName[0] != rep.ByName[0] {
		t.Error("--top 2 is not the first two rows")
	}
}

// TestGPUBusy: the busy time is the union of GPU spans, checked on a 1 µs grid.
func TestGPUBusy(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	tr := &chrome.Trace{Processes: map[uint32]string{1: "p"}}
	const wall = 5000
	tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: "host", Ts: 0, Dur: wall, Pid: 1, Tid: 1})
	grid := make([]bool, wall)
	for i := 0; i < 40; i++ {
		a := r.IntN(wall - 10)
		b := a + 1 + r.IntN(min(300, wall-a-1))
		tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: "k", Cat: GPUCategory, Ts: float64(a), Dur: float64(b - a), Pid: 1, Tid: uint32(2 + r.IntN(2))})
		for x := a; x < b; x++ {
			grid[x] = true
		}
	}
	busy := 0
	for _, g := range grid {
		if g {
			busy++
		}
	}
	rep := Build(tr, 10)
	if !near(rep.GPUBusyMS, float64(busy)/1e3) || !near(rep.GPUBusy, float64(busy)/wall) {
		t.Fatalf("busy %g ms (%g), want %g ms", rep.GPUBusyMS, rep.GPUBusy, float64(busy)/1e3)
	}
}

// TestSteps: per-step phase means and GPU time of generated trainer steps.
func TestSteps(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	tr := &chrome.Trace{Processes: map[uint32]string{7: "trainer"}}
	phases := []string{"data", "forward", "backward", "optimizer", "checkpoint"}
	sums := map[string]float64{}
	steps := 5 + r.IntN(20)
	ts, stepSum, gpuSum := 0.0, 0.0, 0.0
	for i := 0; i < steps; i++ {
		start := ts
		t0 := ts
		for _, p := range phases {
			if p == "checkpoint" && r.IntN(3) != 0 {
				continue
			}
			d := float64(1 + r.IntN(500))
			tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: p, Cat: StepCategory, Ts: t0, Dur: d, Pid: 7, Tid: 7})
			// a grandchild that must not count as a phase
			tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: "inner", Cat: "ops", Ts: t0, Dur: d / 2, Pid: 7, Tid: 7})
			sums[p] += d
			g := float64(r.IntN(int(d)))
			tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: p, Cat: GPUCategory, Ts: t0, Dur: g, Pid: 7, Tid: 7 + 1<<22})
			gpuSum += g
			t0 += d + float64(r.IntN(20))
		}
		dur := t0 - start + float64(r.IntN(50))
		tr.Events = append(tr.Events, chrome.Event{Ph: "X", Name: StepName, Cat: StepCategory, Ts: start, Dur: dur, Pid: 7, Tid: 7})
		stepSum += dur
		ts = start + dur + float64(r.IntN(100))
	}
	rep := Build(tr, 0)
	s := rep.Steps
	if s == nil || s.Count != steps || !near(s.MeanMS, stepSum/float64(steps)/1e3) {
		t.Fatalf("steps %+v, want %d of mean %g", s, steps, stepSum/float64(steps)/1e3)
	}
	var child float64
	for _, p := range s.Phases {
		want := sums[p.Name] / float64(steps) / 1e3
		if !near(p.MeanMS, want) || !near(p.Fraction, sums[p.Name]/stepSum) {
			t.Errorf("%s: %g ms/step (%g), want %g", p.Name, p.MeanMS, p.Fraction, want)
		}
		child += sums[p.Name]
	}
	if len(s.Phases) != len(sums) || !near(s.OtherMeanMS, (stepSum-child)/float64(steps)/1e3) || !near(s.GPUMeanMS, gpuSum/float64(steps)/1e3) {
		t.Fatalf("%d phases (want %d), other %g, gpu %g (want %g)", len(s.Phases), len(sums), s.OtherMeanMS, s.GPUMeanMS, gpuSum/float64(steps)/1e3)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "trainer steps") {
		t.Fatalf("text: %v\n%s", err, text.String())
	}
	b, _ := json.Marshal(rep)
	if !bytes.Contains(b, []byte(`"phases"`)) {
		t.Fatal("json has no phases")
	}
}
