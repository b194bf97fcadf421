package app

import (
	"os"
	"path/filepath"
	"testing"
)

func TestResolveIncludes(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		p = filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("src/a.h", "#include \"sub/b.h\"\n")
	write("src/sub/b.h", "  #  include <c.h>\nint b;\n")
	write("inc/c.h", "int c;\n")
	code := []byte("#include \"a.h\"\n#include <cuda_bf16.h>\n// #include is not a directive here: \"zz.h\"\n")
	h, err := resolveIncludes(code, filepath.Join(dir, "src"), []string{filepath.Join(dir, "inc")})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.h": "#include \"sub/b.h\"\n", "sub/b.h": "  #  include <c.h>\nint b;\n", "c.h": "int c;\n"}
	if len(h) != len(want) {
		t.Fatalf("headers %v, want %v", h, want)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("header %q = %q, want %q", k, h[k], v)
		}
	}
	// An include cycle ends (each name once).
	write("src/x.h", "#include \"y.h\"\n")
	write("src/y.h", "#include \"x.h\"\n")
	if h, err := resolveIncludes([]byte("#include \"x.h\"\n"), filepath.Join(dir, "src"), nil); err != nil || len(h) != 2 {
		t.Fatalf("cycle: %v %v", h, err)
	}
}
