package server

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
)

func fmtSscan(s string, a ...any) (int, error) { return fmt.Sscan(s, a...) }

func hexString(b []byte) string { return hex.EncodeToString(b) }

// TestCuPyExampleCopyInSync: the GPU bundle carries testdata/, so the CuPy
// example lives there too; the copy must be the example itself.
func TestCuPyExampleCopyInSync(t *testing.T) {
	a, err := os.ReadFile("../../../examples/python/gpupool_cupy.py")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/gpupool_cupy.py")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("testdata/gpupool_cupy.py differs from examples/python/gpupool_cupy.py: cp examples/python/gpupool_cupy.py gpupool/internal/server/testdata/")
	}
}
