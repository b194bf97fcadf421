package cli

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// ProgressEnv names the environment variable that decides where progress
// bars are drawn: "auto" (the default: only when stderr is a terminal),
// "always" (also into a pipe or a log file, e.g. a demo script's log) or
// "never".
const ProgressEnv = "GPUKIT_PROGRESS"

// Progress is the one progress bar of every gpukit tool: a bar with a
// count, a rate and an ETA (github.com/schollz/progressbar/v3), drawn on
// stderr at most ten times a second, never on stdout (JSON lines stay
// clean). A nil *Progress is valid and draws nothing, so callers need not
// check whether one is shown.
type Progress struct {
	bar  *progressbar.ProgressBar
	w    io.Writer
	what string
	last time.Time // the last draw (at most ten a second)
	n    int64     // the count not yet drawn
}

// NewProgress returns a bar counting to total (≤ 0: a spinner with a
// count) labelled what ("train", "sample", "score"), unit the name of one
// count ("step", "image"), drawn on w when ProgressEnv allows: "auto"
// draws only when w is a terminal. It returns nil (draws nothing) when w
// is nil or not allowed.
func NewProgress(w io.Writer, total int64, what, unit string) *Progress {
	if !progressOn(w) {
		return nil
	}
	b := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSetItsString(unit),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(24),
		progressbar.OptionOnCompletion(func() { io.WriteString(w, "\n") }),
		progressbar.OptionSetRenderBlankState(true),
	)
	return &Progress{bar: b, w: w, what: what}
}

// progressOn says whether a bar may be drawn on w under ProgressEnv.
func progressOn(w io.Writer) bool {
	if w == nil {
		return false
	}
	switch os.Getenv(ProgressEnv) {
	case "always":
		return true
	case "never":
		return false
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Set moves the bar to n of its total, with detail ("loss 1.234") after
// the label.
func (p *Progress) Set(n int64, detail string) {
	if p == nil {
		return
	}
	p.n = n
	if time.Since(p.last) < 100*time.Millisecond && n < p.bar.GetMax64() {
		return
	}
	p.last = time.Now()
	if detail != "" {
		p.bar.Describe(p.what + " " + detail)
	}
	_ = p.bar.Set64(n)
}

// Add moves the bar n counts on.
func (p *Progress) Add(n int64) {
	if p == nil {
		return
	}
	p.Set(p.n+n, "")
}

// Done ends the bar's line (whether or not it reached its total).
func (p *Progress) Done() {
	if p == nil {
		return
	}
	if !p.bar.IsFinished() {
		_ = p.bar.Set64(p.n) // the last count, which the throttle may have held back
		_ = p.bar.Exit()
		io.WriteString(p.w, "\n")
	}
}
