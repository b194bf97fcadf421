package main

import (
	"os/exec"
	"strings"
	"testing"
)

// cudaPkg is the CUDA binding no tracer package may link.
const cudaPkg = "gpukit/libgpu/cuda"

// importers lists the packages of pattern's dependency closure (go list
// -deps) that import cudaPkg, and whether cudaPkg is in the closure.
func importers(t *testing.T, pattern string) (linked bool, by []string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pattern).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, out)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] == cudaPkg {
			linked = true
		}
		for _, imp := range f[1:] {
			if imp == cudaPkg {
				by = append(by, f[0])
			}
		}
	}
	return linked, by
}

// TestLinksNoCUDA: the tracer reads and writes traces and never touches a
// GPU, so none of its packages may link libgpu/cuda (issue 28): libgpu/trace
// keeps the CUDA half of GPU timing in libgpu/trace/cudaev. The check is
// shown able to fail on cudaev itself.
func TestLinksNoCUDA(t *testing.T) {
	if linked, by := importers(t, "gpukit/tracer/..."); linked {
		t.Fatalf("go list -deps gpukit/tracer/... has %s, imported by %v", cudaPkg, by)
	}
	if linked, by := importers(t, "gpukit/libgpu/trace/cudaev"); !linked || len(by) == 0 {
		t.Fatalf("go list -deps of libgpu/trace/cudaev lacks %s (importers %v): the check above cannot see CUDA", cudaPkg, by)
	}
}
