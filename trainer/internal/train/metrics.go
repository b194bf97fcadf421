package train

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// metricsLog writes a run's JSON lines to stdout and to MetricsFile in the
// run directory (appended to when the run resumes, truncated otherwise).
// A nil *metricsLog writes nothing: a data-parallel rank other than 0.
type metricsLog struct {
	stdout io.Writer
	f      *os.File
}

// openMetrics opens dir's MetricsFile for a run that resumes or starts.
func openMetrics(dir string, resume bool, stdout io.Writer) (*metricsLog, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resume {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(dir, MetricsFile), flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return &metricsLog{stdout: stdout, f: f}, nil
}

// emit writes v as one JSON line to both.
func (m *metricsLog) emit(v any) error {
	if m == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	b = append(b, '\n')
	if _, err := m.stdout.Write(b); err != nil {
		return fmt.Errorf("train: stdout: %w", err)
	}
	if _, err := m.f.Write(b); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return nil
}

// close closes the file (nil: nothing to close).
func (m *metricsLog) close() {
	if m != nil {
		m.f.Close()
	}
}
