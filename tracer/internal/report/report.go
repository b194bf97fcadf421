package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"gpukit/tracer/internal/chrome"
)

// Names of the spans the step breakdown reads (libgpu/trace conventions).
const (
	StepCategory = "trainer"
	StepName     = "step"
	GPUCategory  = "gpu"
)

// Row is one aggregate. Times are milliseconds.
type Row struct {
	Key     string  `json:"key"`
	Count   int     `json:"count"`
	TotalMS float64 `json:"total_ms"`
	SelfMS  float64 `json:"self_ms"`
	MeanMS  float64 `json:"mean_ms"`
}

// Phase is one child name of the steps.
type Phase struct {
	Name      string  `json:"name"`
	MeanMS    float64 `json:"mean_ms_per_step"`
	Fraction  float64 `json:"fraction_of_step"`
	StepsWith int     `json:"steps"`
}

// Steps is the trainer's per-step breakdown.
type Steps struct {
	Count        int     `json:"count"`
	MeanMS       float64 `json:"mean_ms"`
	Phases       []Phase `json:"phases"`
	OtherMeanMS  float64 `json:"other_mean_ms"`
	GPUMeanMS    float64 `json:"gpu_mean_ms"`
	GPUFraction  float64 `json:"gpu_fraction"`
	FirstStepMS  float64 `json:"first_step_ms"`
	MedianStepMS float64 `json:"median_step_ms"`
}

// Report is what `tracer report` prints.
type Report struct {
	Events       int     `json:"events"`
	Spans        int     `json:"spans"`
	Processes    int     `json:"processes"`
	WallMS       float64 `json:"wall_ms"`
	GPUBusyMS    float64 `json:"gpu_busy_ms"`
	GPUBusy      float64 `json:"gpu_busy_fraction"`
	ByName       []Row   `json:"by_name"`
	BySelf       []Row   `json:"by_self"`
	ByCategory   []Row   `json:"by_category"`
	ByProcess    []Row   `json:"by_process"`
	Steps        *Steps  `json:"steps,omitempty"`
	DroppedTotal float64 `json:"client_dropped_events"`
}

type span struct {
	e    *chrome.Event
	self float64 // µs
}

// Build computes the report of tr, keeping the top n rows of each table (n <= 0: all).
func Build(tr *chrome.Trace, n int) *Report {
	r := &Report{Events: len(tr.Events)}
	byTrack := map[[2]uint32][]*span{}
	var spans []*span
	first, last := 0.0, 0.0
	dropped := map[uint32]float64{}
	for i := range tr.Events {
		e := &tr.Events[i]
		if e.Ph == "C" && e.Name == "trace.dropped" {
			if v, ok := e.Args["value"].(float64); ok && v > dropped[e.Pid] {
				dropped[e.Pid] = v
			}
		}
		if e.Ph != "X" {
			continue
		}
		s := &span{e: e, self: e.Dur}
		spans = append(spans, s)
		k := [2]uint32{e.Pid, e.Tid}
		byTrack[k] = append(byTrack[k], s)
		if len(spans) == 1 || e.Ts < first {
			first = e.Ts
		}
		last = max(last, e.End())
	}
	for _, d := range dropped {
		r.DroppedTotal += d
	}
	r.Spans = len(spans)
	if len(spans) > 0 {
		r.WallMS = (last - first) / 1e3
	}
	// Self time: subtract each span's direct children on its track.
	for _, ss := range byTrack {
		sortSpans(ss)
		var stack []*span
		for _, s := range ss {
			for len(stack) > 0 && s.e.Ts >= stack[len(stack)-1].e.End() {
				stack = stack[:len(stack)-1]
			}
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				p.self -= min(s.e.Dur, p.e.End()-s.e.Ts)
			}
			stack = append(stack, s)
		}
	}
	pname := func(pid uint32) string {
		if n, ok := tr.Processes[pid]; ok {
			return n + " (" + strconv.FormatUint(uint64(pid), 10) + ")"
		}
		return "pid " + strconv.FormatUint(uint64(pid), 10)
	}
	r.ByName = aggregate(spans, func(e *chrome.Event) string { return e.Cat + "/" + e.Name }, n, false)
	r.BySelf = aggregate(spans, func(e *chrome.Event) string { return e.Cat + "/" + e.Name }, n, true)
	r.ByCategory = aggregate(spans, func(e *chrome.Event) string { return e.Cat }, n, false)
	r.ByProcess = aggregate(spans, func(e *chrome.Event) string { return pname(e.Pid) }, n, false)
	procs := map[uint32]bool{}
	for _, s := range spans {
		procs[s.e.Pid] = true
	}
	r.Processes = len(procs)

	var gpu [][2]float64
	for _, s := range spans {
		if s.e.Cat == GPUCategory {
			gpu = append(gpu, [2]float64{s.e.Ts, s.e.End()})
		}
	}
	r.GPUBusyMS = unionLen(gpu) / 1e3
	if r.WallMS > 0 {
		r.GPUBusy = r.GPUBusyMS / r.WallMS
	}
	r.Steps = steps(byTrack, spans)
	return r
}

func sortSpans(ss []*span) {
	slices.SortStableFunc(ss, func(a, b *span) int {
		if c := cmp.Compare(a.e.Ts, b.e.Ts); c != 0 {
			return c
		}
		return cmp.Compare(b.e.Dur, a.e.Dur) // the longer one is the parent
	})
}

func aggregate(spans []*span, key func(*chrome.Event) string, n int, bySelf bool) []Row {
	m := map[string]*Row{}
	for _, s := range spans {
		k := key(s.e)
		row := m[k]
		if row == nil {
			row = &Row{Key: k}
			m[k] = row
		}
		row.Count++
		row.TotalMS += s.e.Dur / 1e3
		row.SelfMS += max(0, s.self) / 1e3
	}
	rows := make([]Row, 0, len(m))
	for _, row := range m {
		row.MeanMS = row.TotalMS / float64(row.Count)
		rows = append(rows, *row)
	}
	slices.SortFunc(rows, func(a, b Row) int {
		x, y := a.TotalMS, b.TotalMS
		if bySelf {
			x, y = a.SelfMS, b.SelfMS
		}
		if c := cmp.Compare(y, x); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if n > 0 && len(rows) > n {
		rows = rows[:n]
	}
	return rows
}

// unionLen is the total length covered by the intervals.
func unionLen(iv [][2]float64) float64 {
	slices.SortFunc(iv, func(a, b [2]float64) int { return cmp.Compare(a[0], b[0]) })
	total, end := 0.0, 0.0
	started := false
	for _, x := range iv {
		switch {
		case !started || x[0] >= end:
			total += x[1] - x[0]
			end, started = x[1], true
		case x[1] > end:
			total += x[1] - end
			end = x[1]
		}
	}
	return total
}

func steps(byTrack map[[2]uint32][]*span, spans []*span) *Steps {
	var out Steps
	phase := map[string]*Phase{}
	var order []string
	var durs []float64
	var stepTotal, childTotal, gpuTotal float64
	for k, ss := range byTrack {
		for i, s := range ss {
			if s.e.Cat != StepCategory || s.e.Name != StepName {
				continue
			}
			out.Count++
			durs = append(durs, s.e.Dur)
			stepTotal += s.e.Dur
			seen := map[string]bool{}
			// Direct children: spans after it on the track that start inside
			// it and are not inside an earlier child.
			childEnd := s.e.Ts
			for _, c := range ss[i+1:] {
				if c.e.Ts >= s.e.End() {
					break
				}
				if c.e.Ts < childEnd {
					continue
				}
				childEnd = c.e.End()
				d := min(c.e.End(), s.e.End()) - c.e.Ts
				p := phase[c.e.Name]
				if p == nil {
					p = &Phase{Name: c.e.Name}
					phase[c.e.Name] = p
					order = append(order, c.e.Name)
				}
				p.MeanMS += d
				childTotal += d
				if !seen[c.e.Name] {
					p.StepsWith++
					seen[c.e.Name] = true
				}
			}
			var gpu [][2]float64
			for _, g := range spans {
				if g.e.Pid == k[0] && g.e.Cat == GPUCategory && g.e.End() > s.e.Ts && g.e.Ts < s.e.End() {
					gpu = append(gpu, [2]float64{max(g.e.Ts, s.e.Ts), min(g.e.End(), s.e.End())})
				}
			}
			gpuTotal += unionLen(gpu)
		}
	}
	if out.Count == 0 {
		return nil
	}
	n := float64(out.Count)
	out.MeanMS = stepTotal / n / 1e3
	for _, name := range order {
		p := phase[name]
		p.Fraction = p.MeanMS / stepTotal
		p.MeanMS = p.MeanMS / n / 1e3
		out.Phases = append(out.Phases, *p)
	}
	slices.SortFunc(out.Phases, func(a, b Phase) int {
		if c := cmp.Compare(b.MeanMS, a.MeanMS); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	out.OtherMeanMS = (stepTotal - childTotal) / n / 1e3
	out.GPUMeanMS = gpuTotal / n / 1e3
	out.GPUFraction = gpuTotal / stepTotal
	out.FirstStepMS = durs[0] / 1e3
	sorted := slices.Clone(durs)
	slices.Sort(sorted)
	out.MedianStepMS = sorted[len(sorted)/2] / 1e3
	return &out
}

// WriteText prints the report as tables.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%d events, %d spans, %d processes, wall %.3f ms, GPU busy %.3f ms (%.1f%%)",
		r.Events, r.Spans, r.Processes, r.WallMS, r.GPUBusyMS, 100*r.GPUBusy)
	if r.DroppedTotal > 0 {
		fmt.Fprintf(w, ", %.0f events dropped by clients", r.DroppedTotal)
	}
	fmt.Fprintln(w)
	table := func(title string, rows []Row) {
		if len(rows) == 0 {
			return
		}
		fmt.Fprintf(tw, "\n%s\tcount\ttotal ms\tself ms\tmean ms\t\n", title)
		for _, x := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t\n", x.Key, x.Count, x.TotalMS, x.SelfMS, x.MeanMS)
		}
	}
	table("by name (total)", r.ByName)
	table("by name (self)", r.BySelf)
	table("by category", r.ByCategory)
	table("by process", r.ByProcess)
	if s := r.Steps; s != nil {
		fmt.Fprintf(tw, "\ntrainer steps: %d, mean %.3f ms (first %.3f, median %.3f), GPU %.3f ms/step (%.1f%%)\t\t\t\n",
			s.Count, s.MeanMS, s.FirstStepMS, s.MedianStepMS, s.GPUMeanMS, 100*s.GPUFraction)
		fmt.Fprintf(tw, "phase\tms/step\tshare\tsteps\t\n")
		for _, p := range s.Phases {
			fmt.Fprintf(tw, "%s\t%.3f\t%.1f%%\t%d\t\n", p.Name, p.MeanMS, 100*p.Fraction, p.StepsWith)
		}
		fmt.Fprintf(tw, "(other)\t%.3f\t\t\t\n", s.OtherMeanMS)
	}
	return tw.Flush()
}
