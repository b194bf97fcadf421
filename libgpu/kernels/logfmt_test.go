package kernels

import (
	"strings"
	"testing"
)

func TestRewriteLog(t *testing.T) {
	src := "#include \"common.cuh\"\n" + // 1
		"extern \"C\" __global__ void k(float* x) {\n" + // 2
		"\tfloat y = foo(x[0]);\n" + // 3
		"  int unused;\n" + // 4
		"}\n"
	hdr := "#pragma once\n__device__ int h() { return zz; }\n"
	files := map[string]string{"k.cu": src, "common.cuh": hdr}
	cases := []struct{ name, log, want string }{
		{
			"error with caret, tab-indented source",
			"k.cu(3): error: identifier \"foo\" is undefined\n\tfloat y = foo(x[0]);\n\t          ^\n\n1 error detected in the compilation of \"k.cu\".\n",
			"k.cu:3:12: error: identifier \"foo\" is undefined\n\tfloat y = foo(x[0]);\n\t          ^\n\n1 error detected in the compilation of \"k.cu\".",
		},
		{
			"warning re-indented by the quote",
			"k.cu(4): warning #177-D: variable \"unused\" was declared but never referenced\n    int unused;\n        ^\n",
			"k.cu:4:7: warning #177-D: variable \"unused\" was declared but never referenced\n    int unused;\n        ^",
		},
		{
			"error in a header",
			"common.cuh(2): error: identifier \"zz\" is undefined\n  __device__ int h() { return zz; }\n                              ^\n",
			"common.cuh:2:29: error: identifier \"zz\" is undefined\n  __device__ int h() { return zz; }\n                              ^",
		},
		{
			"older quoted form, no caret",
			"\"k.cu\", line 2: error: expected a \";\"\n",
			"k.cu:2: error: expected a \";\"",
		},
		{
			"unknown file keeps line only",
			"other.cu(7): error: bad\n  x\n  ^\n",
			"other.cu:7: error: bad\n  x\n  ^",
		},
		{
			"file name with parentheses",
			"dir (copy)/k(1).cu(5): catastrophic error: cannot open source file \"x.h\"\n",
			"dir (copy)/k(1).cu:5: catastrophic error: cannot open source file \"x.h\"",
		},
		{"empty", "", ""},
		{"not a diagnostic", "nvrtc: some note\n", "nvrtc: some note"},
	}
	for _, tc := range cases {
		if got := RewriteLog(tc.log, files); got != tc.want {
			t.Errorf("%s:\ngot:\n%s\nwant:\n%s", tc.name, got, tc.want)
		}
	}
}

func FuzzRewriteLog(f *testing.F) {
	f.Add("k.cu(3): error: x\n  abc\n   ^\n", "a\nb\nabc\n")
	f.Add("\"k.cu\", line 99999999999999999999: error: y\n", "")
	f.Fuzz(func(t *testing.T, log, src string) {
		out := RewriteLog(log, map[string]string{"k.cu": src})
		if strings.Count(out, "\n") > strings.Count(log, "\n") {
			t.Fatal("rewrite added lines")
		}
	})
}
