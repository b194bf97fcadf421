package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPythonClient runs examples/python/optimizer_client.py, a client
// written from libgpu/optim/service/PROTOCOL.md alone (Python's standard
// library, with gpupool_client.py's msgpack codec), against a host pool
// and an optimizer service. It skips without python3, unless
// GPUKIT_REQUIRE_PYTHON=1.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("GPUKIT_REQUIRE_PYTHON") == "1" {
			t.Fatal("python3 not found (GPUKIT_REQUIRE_PYTHON=1)")
		}
		t.Skip("python3 not found")
	}
	st := startStack(t, "host")
	cmd := exec.Command(py, filepath.Join("..", "examples", "python", "optimizer_client.py"), "--socket", st.opt, "--pool", st.pool)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\nok\n") {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Logf("%s", out)
}
