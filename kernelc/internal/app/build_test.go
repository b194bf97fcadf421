package app

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteOutputErrorsNameThePath: an output that cannot be written is
// named in the error, not the temporary file beside it.
func TestWriteOutputErrorsNameThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "k.cubin")
	err := writeOutput(nil, path, []byte("x"))
	if err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), ".kernelc-") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("writeOutput into a missing directory: %v", err)
	}
}
