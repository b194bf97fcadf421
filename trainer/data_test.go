package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataSudokuWithoutQQWing: with qqwing and faketime not in PATH,
// trainer data sudoku exits 1 with one line saying how to install them,
// and writes nothing.
func TestDataSudokuWithoutQQWing(t *testing.T) {
	out := filepath.Join(t.TempDir(), "set")
	cmd := exec.Command(filepath.Join(binDir, "trainer"), "data", "sudoku", "--out", out, "--n", "2", "--test-n", "1")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 || so.Len() != 0 || strings.Count(se.String(), "\n") != 1 ||
		!strings.Contains(se.String(), "apt-get install qqwing faketime") {
		t.Fatalf("exit %v, stdout %q, stderr %q", err, so.String(), se.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("--out made without qqwing: %v", err)
	}
}
