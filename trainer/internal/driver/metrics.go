package driver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// metricsLog writes a run's JSON lines to stdout and to MetricsFile in the
// run directory. A nil *metricsLog writes nothing: a data-parallel rank
// other than 0.
type metricsLog struct {
	stdout io.Writer
	f      *os.File
}

// openMetrics opens dir's MetricsFile: truncated for a fresh run; for a
// resumed one, cut after the last line of a step ≤ step (the
// checkpoint's: lines a killed run logged after its last checkpoint are
// logged again by the resumed run, and a line cut short by the kill is
// dropped) and appended to.
func openMetrics(dir string, resume bool, step int, stdout io.Writer) (*metricsLog, error) {
	p := filepath.Join(dir, MetricsFile)
	if resume {
		if err := truncateMetrics(p, step); err != nil {
			return nil, err
		}
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resume {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(p, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	return &metricsLog{stdout: stdout, f: f}, nil
}

// truncateMetrics cuts the metrics file at p before its first line that
// is not a complete JSON line of a step ≤ step.
func truncateMetrics(p string, step int) error {
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	keep := 0
	for keep < len(b) {
		end := bytes.IndexByte(b[keep:], '\n')
		if end < 0 {
			break // a line cut short
		}
		var l struct {
			Step *int `json:"step"`
		}
		if json.Unmarshal(b[keep:keep+end], &l) != nil || l.Step == nil || *l.Step > step {
			break
		}
		keep += end + 1
	}
	if keep == len(b) {
		return nil
	}
	if err := os.Truncate(p, int64(keep)); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

// emit writes v as one JSON line to both.
func (m *metricsLog) emit(v any) error {
	if m == nil {
		return nil
	}
	b, err := marshalNoEscape(v)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	b = append(b, '\n')
	if _, err := m.stdout.Write(b); err != nil {
		return fmt.Errorf("trainer: stdout: %w", err)
	}
	if _, err := m.f.Write(b); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	return nil
}

// close closes the file (nil: nothing to close).
func (m *metricsLog) close() {
	if m != nil {
		m.f.Close()
	}
}

// metricLines reads the JSON lines of a metrics file, each decoded by
// fn (lines that are not JSON objects are skipped).
func metricLines(p string, fn func(line []byte)) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		fn(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("trainer: reading %s: %w", p, err)
	}
	return nil
}
