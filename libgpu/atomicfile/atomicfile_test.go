package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteWholeOrNothing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.bin")
	if err := Write(p, Options{Sync: true}, func(w io.Writer) error { _, err := io.WriteString(w, "one"); return err }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(p, Options{}, func(w io.Writer) error { io.WriteString(w, "half"); return boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), ".tmp") {
		t.Fatalf("failed write: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("a failed write changed the file: %q", b)
	}
	if l, _ := Litter(p); len(l) != 0 {
		t.Fatalf("litter left: %v", l)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

func TestWriteErrorsNameThePath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing", "f.bin")
	err := Write(p, Options{}, func(io.Writer) error { return nil })
	if err == nil || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), ".tmp") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("write into a missing directory: %v", err)
	}
	// The rename over a directory fails after the temporary file exists.
	dir := t.TempDir()
	q := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(q, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	err = Write(q, Options{}, func(io.Writer) error { return nil })
	if err == nil || !strings.Contains(err.Error(), q) || strings.Contains(err.Error(), ".tmp") {
		t.Fatalf("rename over a directory: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("the failed write left %d entries", len(ents))
	}
}
