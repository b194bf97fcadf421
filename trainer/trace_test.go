package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// traceEvent is the part of a Chrome trace event the tests read.
type traceEvent struct {
	Ph   string          `json:"ph"`
	Name string          `json:"name"`
	Cat  string          `json:"cat"`
	Ts   float64         `json:"ts"`  // µs
	Dur  float64         `json:"dur"` // µs
	Pid  uint32          `json:"pid"`
	Tid  uint32          `json:"tid"`
	Args json.RawMessage `json:"args"`
}

// readTrace reads the events of the Chrome trace JSON file.
func readTrace(t *testing.T, file string) []traceEvent {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return f.TraceEvents
}

// tracerBin is $GPUKIT_BIN/tracer (the GPU bundle), or tracer built from
// ../tracer into a temp dir.
func tracerBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("GPUKIT_BIN"); bin != "" {
		return filepath.Join(bin, "tracer")
	}
	out := filepath.Join(t.TempDir(), "tracer")
	build := exec.Command("go", "build", "-o", out, ".")
	build.Dir = filepath.Join("..", "tracer")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building tracer: %v: %s", err, b)
	}
	return out
}

// tracedRun runs `tracer record -- trainer run ARGS` and returns the events
// of the trainer run's process, and the id of its "GPU: trainer" track (0
// when it has none).
func tracedRun(t *testing.T, tracer string, args ...string) (evs []traceEvent, gpuTid uint32) {
	t.Helper()
	work := t.TempDir()
	file := filepath.Join(work, "trace.json")
	cmd := exec.Command(tracer, append([]string{"record", "--out", file, "--",
		filepath.Join(binDir, "trainer"), "run", "--out", filepath.Join(work, "run")}, args...)...)
	var se strings.Builder
	cmd.Stderr = &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("tracer record -- trainer run %v: %v\n%s", args, err, se.String())
	}
	if strings.Contains(se.String(), "events dropped") {
		t.Fatalf("the trainer dropped events:\n%s", se.String())
	}
	all := readTrace(t, file)
	var pid uint32
	for _, e := range all {
		if e.Ph == "X" && e.Cat == "trainer" && e.Name == "step" {
			pid = e.Pid
			break
		}
	}
	if pid == 0 {
		t.Fatalf("no trainer step span in the trace:\n%s", se.String())
	}
	for _, e := range all {
		if e.Pid != pid {
			continue
		}
		if e.Ph == "M" && e.Name == "thread_name" && strings.Contains(string(e.Args), `"GPU: trainer"`) {
			gpuTid = e.Tid
		}
		evs = append(evs, e)
	}
	return evs, gpuTid
}

// spans returns the X events named name, of category cat, on the GPU
// track (gpu) or off it, in order of start.
func spans(evs []traceEvent, gpuTid uint32, gpu bool, cat, name string) []traceEvent {
	var out []traceEvent
	for _, e := range evs {
		if e.Ph == "X" && e.Cat == cat && e.Name == name && (e.Tid == gpuTid) == gpu {
			out = append(out, e)
		}
	}
	byStart(out)
	return out
}

// byStart sorts events by start time, keeping the file's order of ties.
func byStart(out []traceEvent) {
	slices.SortStableFunc(out, func(a, b traceEvent) int {
		switch {
		case a.Ts < b.Ts:
			return -1
		case a.Ts > b.Ts:
			return 1
		}
		return 0
	})
}

// TestGPUTraceSpans: a short run on the GPU under tracer record, with
// --graph on and off. With graphs, every replay (all steps but the first,
// which runs eagerly) is a GPU span "graph replay" that starts no earlier
// than its host "graph replay" span, and the eager first step has one GPU
// span per phase; without, every step has a GPU span for each of forward,
// backward and optimizer. GPU spans have positive durations and, on their
// one stream, start in order. (That the durations agree with a CUDA-event
// pair around the same region is libgpu/trace's TestGPU*SpansMatchEvents.)
func TestGPUTraceSpans(t *testing.T) {
	dir := gpuData(t)
	tracer := tracerBin(t)
	const steps = 30
	common := []string{"--data", dir, "--device", "cuda", "--limit", strconv.Itoa(steps * 128), "--batch", "128",
		"--epochs", "1", "--log-every", "10", "--widths", "784,512,512,10"}
	phases := []string{"forward", "backward", "optimizer"}
	for _, graph := range []string{"on", "off"} {
		t.Run("graph="+graph, func(t *testing.T) {
			evs, gpuTid := tracedRun(t, tracer, append(common, "--graph", graph)...)
			if gpuTid == 0 {
				t.Fatal(`no "GPU: trainer" track in the trainer's process`)
			}
			if n := len(spans(evs, gpuTid, false, "trainer", "step")); n != steps {
				t.Fatalf("%d step spans, want %d", n, steps)
			}
			var all []traceEvent
			eager := steps
			if graph == "on" {
				eager = 1
				host := spans(evs, gpuTid, false, "trainer", "graph replay")
				gpu := spans(evs, gpuTid, true, "gpu", "graph replay")
				if len(host) != steps-1 || len(gpu) != steps-1 {
					t.Fatalf("%d host and %d GPU graph replay spans, want %d of each", len(host), len(gpu), steps-1)
				}
				for i := range gpu {
					if gpu[i].Ts < host[i].Ts {
						t.Fatalf("replay %d: the GPU span starts at %.3f µs, before its launch at %.3f µs", i+1, gpu[i].Ts, host[i].Ts)
					}
				}
				all = append(all, gpu...)
			}
			for _, ph := range phases {
				gpu := spans(evs, gpuTid, true, "gpu", ph)
				if len(gpu) != eager {
					t.Fatalf("%d GPU %s spans, want one per eager step (%d)", len(gpu), ph, eager)
				}
				all = append(all, gpu...)
			}
			// One stream runs its regions in the order they were queued:
			// the phases of each eager step, then the replays.
			var want, got []string
			for range eager {
				want = append(want, phases...)
			}
			for range steps - eager {
				want = append(want, "graph replay")
			}
			var onTrack []traceEvent
			for _, e := range evs {
				if e.Ph == "X" && e.Tid == gpuTid {
					onTrack = append(onTrack, e)
				}
			}
			byStart(onTrack)
			for _, e := range onTrack {
				got = append(got, e.Name)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("GPU spans by start time: %v\nwant %v", got, want)
			}
			var sum float64
			for _, e := range all {
				if !(e.Dur > 0) {
					t.Fatalf("GPU span %s at %.3f µs has duration %v", e.Name, e.Ts, e.Dur)
				}
				sum += e.Dur
			}
			t.Logf("--graph %s: %d GPU spans, %.1f µs of GPU time in all", graph, len(all), sum)
		})
	}
}

// TestTraceSpans: on the host, under tracer record, every step is a
// "step" span with one each of data, forward, backward and optimizer inside
// it, and each epoch ends with an evaluate and a checkpoint span.
func TestTraceSpans(t *testing.T) {
	dir := requireData(t)
	const steps, epochs = 12, 2
	evs, gpuTid := tracedRun(t, tracerBin(t), "--data", dir, "--device", "host", "--limit", strconv.Itoa(steps*64),
		"--batch", "64", "--epochs", strconv.Itoa(epochs), "--log-every", "5", "--widths", "784,32,10")
	if gpuTid != 0 {
		t.Fatal("a GPU track on the host")
	}
	step := spans(evs, 0, false, "trainer", "step")
	if len(step) != steps*epochs {
		t.Fatalf("%d step spans, want %d", len(step), steps*epochs)
	}
	for _, name := range []string{"data", "forward", "backward", "optimizer"} {
		ph := spans(evs, 0, false, "trainer", name)
		if len(ph) != len(step) {
			t.Fatalf("%d %s spans for %d steps", len(ph), name, len(step))
		}
		for i := range ph {
			if ph[i].Ts < step[i].Ts || ph[i].Ts+ph[i].Dur > step[i].Ts+step[i].Dur {
				t.Fatalf("%s span %d [%.3f, +%.3f] µs is not inside step %d [%.3f, +%.3f]",
					name, i, ph[i].Ts, ph[i].Dur, i+1, step[i].Ts, step[i].Dur)
			}
		}
	}
	// A checkpoint per epoch, and the final one.
	if n, m := len(spans(evs, 0, false, "trainer", "evaluate")), len(spans(evs, 0, false, "trainer", "checkpoint")); n != epochs || m != epochs+1 {
		t.Fatalf("%d evaluate and %d checkpoint spans, want %d and %d", n, m, epochs, epochs+1)
	}
}
