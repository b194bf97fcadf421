package train

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws a one-line bar on a terminal, at most ten times a second;
// loss is the last logged loss (0: none yet). With epochs 0 it counts steps
// (batch of total) instead of batches of epochs.
type progress struct {
	w             io.Writer
	epochs, total int
	last          time.Time
	drawn         bool
}

func newProgress(w io.Writer, epochs, batches int) *progress {
	return &progress{w: w, epochs: epochs, total: batches}
}

func (p *progress) update(epoch, batch int, loss float32) {
	if p.w == nil || (time.Since(p.last) < 100*time.Millisecond && batch != p.total) {
		return
	}
	p.last = time.Now()
	const width = 30
	fill := width * batch / p.total
	l := "-"
	if loss != 0 {
		l = fmt.Sprintf("%.4f", loss)
	}
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	if p.epochs == 0 { // a run counted in steps, not epochs
		fmt.Fprintf(p.w, "\rstep [%s] %d/%d loss %s ", bar, batch, p.total, l)
	} else {
		fmt.Fprintf(p.w, "\repoch %d/%d [%s] %d/%d loss %s ", epoch+1, p.epochs, bar, batch, p.total, l)
	}
	p.drawn = true
}

func (p *progress) done() {
	if p.w != nil && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
