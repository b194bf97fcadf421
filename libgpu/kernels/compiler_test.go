package kernels

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeNVRTC stands in for NVRTC: its "image" is a digest of what it was
// given, so a test can tell a fresh compile from a cached one and check that
// a cached image is byte-identical to what a compile produces. A source
// containing "#error" fails like NVRTC does, with a log naming the line.
type fakeNVRTC struct {
	mu      sync.Mutex
	version string
	calls   int
	jobs    []Job
}

func (f *fakeNVRTC) Version() (string, error) { return f.version, nil }

func (f *fakeNVRTC) Compile(j Job) (Output, error) {
	f.mu.Lock()
	f.calls++
	f.jobs = append(f.jobs, j)
	f.mu.Unlock()
	for i, l := range strings.Split(string(j.Code), "\n") {
		if c := strings.Index(l, "#error"); c >= 0 {
			log := fmt.Sprintf("%s(%d): error: #error directive: %s\n  %s\n  %s^\n\n1 error detected in the compilation of \"%s\".\n",
				j.Name, i+1, strings.TrimSpace(l[c+6:]), l, strings.Repeat(" ", c), j.Name)
			return Output{Log: log}, fmt.Errorf("fake nvrtc: %w", ErrCompile)
		}
	}
	h := sha256.New()
	h.Write(j.Code)
	fmt.Fprint(h, j.Flags, j.NameExprs, j.PTX)
	low := map[string]string{}
	for _, e := range j.NameExprs {
		low[e] = fmt.Sprintf("_Z%d%s", len(e), e)
	}
	return Output{Image: append([]byte("IMG"), h.Sum(nil)...), Lowered: low}, nil
}

func (f *fakeNVRTC) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

func TestCompilerCacheHit(t *testing.T) {
	fake := &fakeNVRTC{version: "13.0"}
	c := NewCompiler(fake, openTemp(t))
	src := Source{Name: "k.cu", Code: []byte("template<class T> __global__ void k(T*) {}")}
	opts := Options{Arch: "sm_90a", NameExprs: []string{"k<float>", "k<double>"}}
	first, err := c.Compile(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.CacheHit || fake.count() != 1 || len(first.Cubin) == 0 || first.PTX != nil {
		t.Fatalf("first compile: hit=%v calls=%d cubin=%d", first.CacheHit, fake.count(), len(first.Cubin))
	}
	second, err := c.Compile(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !second.CacheHit || fake.count() != 1 {
		t.Fatalf("second compile: hit=%v calls=%d", second.CacheHit, fake.count())
	}
	if !bytes.Equal(first.Cubin, second.Cubin) || second.Key != first.Key {
		t.Fatal("cached image differs from the compiled one")
	}
	for _, e := range opts.NameExprs {
		if second.LoweredNames[e] == "" || second.LoweredNames[e] != first.LoweredNames[e] {
			t.Fatalf("lowered name of %s: %q, want %q", e, second.LoweredNames[e], first.LoweredNames[e])
		}
	}
	// A second process (another Compiler over the same directory) hits too.
	other, err := OpenCache(c.Cache().Dir())
	if err != nil {
		t.Fatal(err)
	}
	c2 := NewCompiler(fake, other)
	if r, err := c2.Compile(src, opts); err != nil || !r.CacheHit {
		t.Fatalf("other compiler: hit=%v err=%v", r.CacheHit, err)
	}
}

func TestCompilerArchAndOptionsSeparateEntries(t *testing.T) {
	fake := &fakeNVRTC{version: "13.0"}
	c := NewCompiler(fake, openTemp(t))
	src := Source{Name: "k.cu", Code: []byte("__global__ void k() {}")}
	variants := []Options{
		{Arch: "sm_90a"}, {Arch: "sm_90"}, {Arch: "sm_90a", PTX: true},
		{Arch: "sm_90a", FastMath: true}, {Arch: "sm_90a", Defines: []string{"N=4"}},
		{Arch: "sm_90a", NameExprs: []string{"k"}},
	}
	keys := map[string]bool{}
	for _, o := range variants {
		r, err := c.Compile(src, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.CacheHit || keys[r.Key] {
			t.Fatalf("%+v shares a cache entry with an earlier variant", o)
		}
		keys[r.Key] = true
	}
	if fake.count() != len(variants) {
		t.Fatalf("%d NVRTC calls, want %d", fake.count(), len(variants))
	}
	if !strings.Contains(strings.Join(fake.jobs[2].Flags, " "), "--gpu-architecture=compute_90a") || !fake.jobs[2].PTX {
		t.Fatalf("PTX job flags %v", fake.jobs[2].Flags)
	}
	// A new NVRTC version misses every entry.
	fake2 := &fakeNVRTC{version: "13.1"}
	r, err := NewCompiler(fake2, c.Cache()).Compile(src, variants[0])
	if err != nil || r.CacheHit {
		t.Fatalf("new NVRTC version hit the old entry: %v %v", r.CacheHit, err)
	}
}

func TestCompilerRecompilesCorruptEntry(t *testing.T) {
	for name, damage := range corruptions {
		t.Run(name, func(t *testing.T) {
			fake := &fakeNVRTC{version: "13.0"}
			c := NewCompiler(fake, openTemp(t))
			var noted []string
			c.OnCorrupt = func(key string, err error) { noted = append(noted, key) }
			src := Source{Name: "k.cu", Code: []byte("__global__ void k() {} // " + name)}
			opts := Options{Arch: "sm_90a"}
			good, err := c.Compile(src, opts)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(c.Cache().Dir(), good.Key)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, damage(b, Key([]byte("x"), nil, "", "")), 0o644)

			r, err := c.Compile(src, opts)
			if err != nil {
				t.Fatal(err)
			}
			if r.CacheHit || fake.count() != 2 || r.Recovered == "" || len(noted) != 1 || noted[0] != good.Key {
				t.Fatalf("hit=%v calls=%d recovered=%q noted=%v: want a recompile", r.CacheHit, fake.count(), r.Recovered, noted)
			}
			if !bytes.Equal(r.Cubin, good.Cubin) {
				t.Fatal("recompiled image differs")
			}
			// The entry was rewritten and is good again.
			r3, err := c.Compile(src, opts)
			if err != nil || !r3.CacheHit || !bytes.Equal(r3.Cubin, good.Cubin) {
				t.Fatalf("third compile: hit=%v err=%v", r3.CacheHit, err)
			}
		})
	}
}

func TestCompilerBadPayloadRecompiles(t *testing.T) {
	fake := &fakeNVRTC{version: "13.0"}
	c := NewCompiler(fake, openTemp(t))
	src := Source{Name: "k.cu", Code: []byte("__global__ void k() {}")}
	good, err := c.Compile(src, Options{Arch: "sm_90a"})
	if err != nil {
		t.Fatal(err)
	}
	// A well-formed entry whose payload is not a Compiler payload.
	if err := c.Cache().Put(good.Key, []byte("junk")); err != nil {
		t.Fatal(err)
	}
	r, err := c.Compile(src, Options{Arch: "sm_90a"})
	if err != nil || r.CacheHit || r.Recovered == "" || !bytes.Equal(r.Cubin, good.Cubin) {
		t.Fatalf("hit=%v recovered=%q err=%v", r.CacheHit, r.Recovered, err)
	}
}

func TestCompilerErrorNamesFileLineCol(t *testing.T) {
	fake := &fakeNVRTC{version: "13.0"}
	c := NewCompiler(fake, openTemp(t))
	code := "// line 1\n__global__ void k() {\n\t  #error boom\n}\n"
	_, err := c.Compile(Source{Name: "bad.cu", Code: []byte(code)}, Options{Arch: "sm_90a"})
	var ce *CompileError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCompile) {
		t.Fatalf("error %v, want a *CompileError", err)
	}
	if !strings.HasPrefix(ce.Log, "bad.cu:3:4: error: #error directive: boom\n") {
		t.Fatalf("log:\n%s", ce.Log)
	}
	if es, _ := c.Cache().List(); len(es) != 0 {
		t.Fatal("a failed compile was cached")
	}
}

func TestCompilerNoNVRTC(t *testing.T) {
	_, err := NewCompiler(nil, nil).Compile(Source{Name: "a.cu"}, Options{Arch: "sm_90a"})
	if !errors.Is(err, ErrNoCompiler) {
		t.Fatalf("got %v, want ErrNoCompiler", err)
	}
}

func TestOptionsFlags(t *testing.T) {
	f, err := Options{Arch: "sm_90a", FastMath: true, LineInfo: true, Defines: []string{"A", "B=x y"},
		IncludeDirs: []string{"/inc"}, Extra: []string{"-G"}}.Flags()
	if err != nil {
		t.Fatal(err)
	}
	want := "--gpu-architecture=sm_90a -std=c++17 -default-device --use_fast_math --generate-line-info -DA -DB=x y -I/inc -G"
	if got := strings.Join(f, " "); got != want {
		t.Fatalf("flags %q\nwant  %q", got, want)
	}
	d, _ := Options{Arch: "compute_86"}.Flags()
	if d[0] != "--gpu-architecture=sm_86" || strings.Contains(strings.Join(d, " "), "fast_math") {
		t.Fatalf("default flags %v", d)
	}
	for _, bad := range []Options{{}, {Arch: "sm90"}, {Arch: "sm_90b"}, {Arch: "sm_90a", Defines: []string{"1X"}}} {
		if _, err := bad.Flags(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	for _, o := range []Options{{Arch: "sm_90a"}, {Arch: "sm_80", PTX: true}} {
		fl, _ := o.Flags()
		for _, x := range fl {
			if x == "-O3" {
				t.Fatal("-O3 passed to NVRTC")
			}
		}
	}
}

func TestArch(t *testing.T) {
	cases := map[[2]int]string{{9, 0}: "sm_90a", {8, 0}: "sm_80", {8, 6}: "sm_86", {8, 9}: "sm_89",
		{10, 0}: "sm_100a", {12, 0}: "sm_120a", {7, 5}: "sm_75"}
	for cc, want := range cases {
		if got := Arch(cc[0], cc[1]); got != want {
			t.Errorf("Arch(%d,%d) = %s, want %s", cc[0], cc[1], got, want)
		}
		sm, _, err := ParseArch(cases[cc])
		if err != nil || sm != cc[0]*10+cc[1] {
			t.Errorf("ParseArch(%s) = %d, %v", want, sm, err)
		}
	}
}

func TestEmbeddedSources(t *testing.T) {
	// Every .cu file in this directory is embedded (the go:embed pattern
	// must pick up files other helpers add).
	des, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, n := range Sources() {
		have[n] = true
	}
	for _, d := range des {
		if filepath.Ext(d.Name()) == ".cu" && !have[d.Name()] {
			t.Errorf("%s is not embedded", d.Name())
		}
	}
	s, err := Embedded("selftest.cu")
	if err != nil {
		t.Fatal(err)
	}
	disk, _ := os.ReadFile("selftest.cu")
	if !bytes.Equal(s.Code, disk) || s.Headers["common.cuh"] == "" {
		t.Fatal("embedded selftest.cu or common.cuh missing")
	}
	for _, bad := range []string{"nope.cu", "common.cuh", "../x.cu"} {
		if _, err := Embedded(bad); !errors.Is(err, ErrNoSource) {
			t.Errorf("Embedded(%q): %v", bad, err)
		}
	}
}

func TestSourceDirReplaces(t *testing.T) {
	// $GPUKIT_KERNEL_SRC replaces the embedded files it holds, the others
	// stay embedded, and the compile key changes with the replaced text.
	dir := t.TempDir()
	code := []byte("// replaced\n")
	if err := os.WriteFile(filepath.Join(dir, "selftest.cu"), code, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "common.cuh"), []byte("// hdr\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	orig, err := Embedded("selftest.cu")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(SourceDirEnv, dir)
	s, err := Embedded("selftest.cu")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Code, code) || s.Headers["common.cuh"] != "// hdr\n" {
		t.Fatalf("replacement not read: %q, common.cuh %q", s.Code, s.Headers["common.cuh"])
	}
	if s.Headers["mma.cuh"] != orig.Headers["mma.cuh"] || s.Headers["mma.cuh"] == "" {
		t.Error("a header absent from the directory did not come from the embedded set")
	}
	if KeySource(s, nil, "13.0", "sm_90") == KeySource(orig, nil, "13.0", "sm_90") {
		t.Error("replaced source has the embedded one's compile key")
	}
	if _, err := Embedded("nope.cu"); !errors.Is(err, ErrNoSource) {
		t.Errorf("Embedded(nope.cu) with a source dir: %v", err)
	}
}

func FuzzDecodePayload(f *testing.F) {
	f.Add(encodePayload([]byte("img"), map[string]string{"k<float>": "_Z1kIfEvPT_"}, "warn"))
	f.Add(encodePayload(nil, nil, ""))
	f.Add([]byte(payloadMagic + "\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, low, log, err := decodePayload(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodePayload(img, low, log), b) {
			t.Fatal("accepted payload does not re-encode to the same bytes")
		}
	})
}

func TestDropPCHNotes(t *testing.T) {
	in := "\"a.cu\": creating precompiled header file \"/tmp/__nvrtc_auto_pch_1/a_0.pch\"\na.cu(3): warning: unused variable"
	if got := dropPCHNotes(in); got != "a.cu(3): warning: unused variable" {
		t.Fatalf("got %q", got)
	}
	if got := dropPCHNotes("a.cu(1): error: x"); got != "a.cu(1): error: x" {
		t.Fatalf("plain log changed: %q", got)
	}
}
