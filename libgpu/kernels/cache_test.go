package kernels

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

func TestKeyEveryInputCounts(t *testing.T) {
	r := newRand(t)
	src := randBytes(r, 100+r.IntN(100))
	opts := []string{"--gpu-architecture=sm_90a", "-std=c++17"}
	base := Key(src, opts, "13.0", "sm_90a")
	if len(base) != 64 || !validKey(base) {
		t.Fatalf("key %q is not 64 hex digits", base)
	}
	if again := Key(append([]byte(nil), src...), append([]string(nil), opts...), "13.0", "sm_90a"); again != base {
		t.Fatalf("same inputs gave %s and %s", base, again)
	}
	flipped := append([]byte(nil), src...)
	flipped[r.IntN(len(flipped))] ^= 1 << r.IntN(8)
	variants := map[string]string{
		"source byte":     Key(flipped, opts, "13.0", "sm_90a"),
		"source longer":   Key(append(append([]byte(nil), src...), 0), opts, "13.0", "sm_90a"),
		"option added":    Key(src, append(append([]string(nil), opts...), "--use_fast_math"), "13.0", "sm_90a"),
		"options order":   Key(src, []string{opts[1], opts[0]}, "13.0", "sm_90a"),
		"options joined":  Key(src, []string{opts[0] + " " + opts[1]}, "13.0", "sm_90a"),
		"options none":    Key(src, nil, "13.0", "sm_90a"),
		"nvrtc version":   Key(src, opts, "13.1", "sm_90a"),
		"arch sm_90":      Key(src, opts, "13.0", "sm_90"),
		"arch compute":    Key(src, opts, "13.0", "compute_90a"),
		"version+arch mv": Key(src, opts, "13.0sm_90a", ""),
	}
	seen := map[string]string{base: "base"}
	for what, k := range variants {
		if prev, dup := seen[k]; dup {
			t.Errorf("%s gives the same key as %s", what, prev)
		}
		seen[k] = what
	}
}

func TestKeySourceHeadersCount(t *testing.T) {
	s := Source{Name: "a.cu", Code: []byte("x"), Headers: map[string]string{"h.cuh": "1", "g.cuh": "2"}}
	base := KeySource(s, nil, "13.0", "sm_90a")
	mut := []Source{
		{Name: "b.cu", Code: s.Code, Headers: s.Headers},
		{Name: "a.cu", Code: s.Code, Headers: map[string]string{"h.cuh": "1", "g.cuh": "3"}},
		{Name: "a.cu", Code: s.Code, Headers: map[string]string{"h.cuh": "1", "f.cuh": "2"}},
		{Name: "a.cu", Code: s.Code, Headers: map[string]string{"h.cuh": "1"}},
	}
	for i, m := range mut {
		if KeySource(m, nil, "13.0", "sm_90a") == base {
			t.Errorf("variant %d: key did not change", i)
		}
	}
	// Map order must not matter.
	for i := 0; i < 20; i++ {
		h := map[string]string{"g.cuh": "2", "h.cuh": "1"}
		if KeySource(Source{Name: "a.cu", Code: []byte("x"), Headers: h}, nil, "13.0", "sm_90a") != base {
			t.Fatal("key depends on header map order")
		}
	}
}

func openTemp(t *testing.T) *Cache {
	t.Helper()
	c, err := OpenCache(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func onlyEntries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range des {
		if !validKey(d.Name()) {
			t.Errorf("unexpected file %q left in the cache", d.Name())
		}
		names = append(names, d.Name())
	}
	return names
}

func TestPutGet(t *testing.T) {
	r := newRand(t)
	c := openTemp(t)
	keys := map[string][]byte{}
	for i := 0; i < 8; i++ {
		data := randBytes(r, r.IntN(5000))
		k := Key(data, nil, "13.0", "sm_90a")
		keys[k] = data
		if err := c.Put(k, data); err != nil {
			t.Fatal(err)
		}
	}
	for k, want := range keys {
		got, ok, err := c.Get(k)
		if err != nil || !ok || !bytes.Equal(got, want) {
			t.Fatalf("Get(%s) = %d bytes, %v, %v; want %d bytes", k[:8], len(got), ok, err, len(want))
		}
	}
	miss := Key([]byte("absent"), nil, "", "")
	if got, ok, err := c.Get(miss); got != nil || ok || err != nil {
		t.Fatalf("missing key: %v %v %v", got, ok, err)
	}
	if n := len(onlyEntries(t, c.Dir())); n != len(keys) {
		t.Fatalf("%d files, want %d", n, len(keys))
	}
	es, err := c.List()
	if err != nil || len(es) != len(keys) {
		t.Fatalf("List: %d entries, %v", len(es), err)
	}
	var total int64
	for _, e := range es {
		if e.Size != int64(len(keys[e.Key])) {
			t.Errorf("entry %s size %d, want %d", e.Key[:8], e.Size, len(keys[e.Key]))
		}
		total += e.Size
	}
	st, err := c.Stats()
	if err != nil || st.Entries != len(keys) || st.Bytes != total || st.Hits != int64(len(keys)) || st.Misses != 1 || st.Puts != 8 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
}

func TestBadKey(t *testing.T) {
	c := openTemp(t)
	for _, k := range []string{"", "../etc/passwd", strings.Repeat("A", 64), strings.Repeat("a", 63)} {
		if _, _, err := c.Get(k); !errors.Is(err, ErrBadKey) {
			t.Errorf("Get(%q): %v, want ErrBadKey", k, err)
		}
		if err := c.Put(k, nil); !errors.Is(err, ErrBadKey) {
			t.Errorf("Put(%q): %v, want ErrBadKey", k, err)
		}
	}
}

func TestConcurrentPutSameKey(t *testing.T) {
	r := newRand(t)
	c := openTemp(t)
	data := randBytes(r, 64<<10)
	k := Key(data, nil, "13.0", "sm_90a")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if err := c.Put(k, data); err != nil {
					errs <- err
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				got, ok, err := c.Get(k)
				if err != nil {
					errs <- err // a reader must never see a partial entry
				} else if ok && !bytes.Equal(got, data) {
					errs <- errors.New("Get returned other bytes")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if names := onlyEntries(t, c.Dir()); len(names) != 1 || names[0] != k {
		t.Fatalf("files %v, want just %s", names, k)
	}
}

// corruptions damage an entry file in the ways a crash, a disk or a person can.
var corruptions = map[string]func(b []byte, other string) []byte{
	"truncated payload": func(b []byte, _ string) []byte { return b[:len(b)-1] },
	"truncated header":  func(b []byte, _ string) []byte { return b[:entryHeaderLen/2] },
	"empty":             func(b []byte, _ string) []byte { return nil },
	"payload bit flip":  func(b []byte, _ string) []byte { b[len(b)-3] ^= 0x10; return b },
	"sha bit flip":      func(b []byte, _ string) []byte { b[100] ^= 1; return b },
	"bad magic":         func(b []byte, _ string) []byte { b[0] = 'X'; return b },
	"future version":    func(b []byte, _ string) []byte { b[8] = 2; return b },
	"length field":      func(b []byte, _ string) []byte { b[80]++; return b },
	"appended byte":     func(b []byte, _ string) []byte { return append(b, 0) },
	"other key inside":  func(b []byte, other string) []byte { copy(b[16:80], other); return b },
}

func TestCorruptEntryIsRemovedAndAMiss(t *testing.T) {
	r := newRand(t)
	for name, damage := range corruptions {
		t.Run(name, func(t *testing.T) {
			c := openTemp(t)
			data := randBytes(r, 100+r.IntN(1000))
			k := Key(data, nil, "13.0", "sm_90a")
			if err := c.Put(k, data); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(c.Dir(), k)
			b, _ := os.ReadFile(p)
			other := Key([]byte("other"), nil, "", "")
			if err := os.WriteFile(p, damage(b, other), 0o644); err != nil {
				t.Fatal(err)
			}
			got, ok, err := c.Get(k)
			if !errors.Is(err, ErrCorrupt) || ok || got != nil {
				t.Fatalf("Get = %d bytes, %v, %v; want a miss with ErrCorrupt", len(got), ok, err)
			}
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Fatalf("corrupt entry still on disk: %v", err)
			}
			if got, ok, err := c.Get(k); got != nil || ok || err != nil {
				t.Fatalf("second Get = %v %v %v, want a plain miss", got, ok, err)
			}
			if st, _ := c.Stats(); st.Corrupt != 1 {
				t.Fatalf("Stats.Corrupt = %d, want 1", st.Corrupt)
			}
		})
	}
}

func TestVerify(t *testing.T) {
	r := newRand(t)
	c := openTemp(t)
	var keys []string
	for i := 0; i < 6; i++ {
		d := randBytes(r, 50+r.IntN(500))
		k := Key(d, nil, "13.0", "sm_90a")
		keys = append(keys, k)
		if err := c.Put(k, d); err != nil {
			t.Fatal(err)
		}
	}
	badSet := map[string]bool{keys[1]: true, keys[4]: true}
	for k := range badSet {
		p := filepath.Join(c.Dir(), k)
		b, _ := os.ReadFile(p)
		b[len(b)-1] ^= 0xff
		os.WriteFile(p, b, 0o644)
	}
	bad, err := c.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != len(badSet) {
		t.Fatalf("Verify found %v, want %d entries", bad, len(badSet))
	}
	for _, b := range bad {
		k, reason, _ := strings.Cut(b, ": ")
		if !badSet[k] || !strings.Contains(reason, "sha256") {
			t.Errorf("unexpected report %q", b)
		}
	}
	if names := onlyEntries(t, c.Dir()); len(names) != len(keys)-len(badSet) {
		t.Fatalf("%d entries left, want %d", len(names), len(keys)-len(badSet))
	}
	if bad, err := c.Verify(); len(bad) != 0 || err != nil {
		t.Fatalf("second Verify: %v %v", bad, err)
	}
}

func TestClear(t *testing.T) {
	c := openTemp(t)
	for i := 0; i < 3; i++ {
		d := []byte{byte(i)}
		if err := c.Put(Key(d, nil, "", ""), d); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(c.Dir(), tempPrefix+"dead-123"), []byte("partial"), 0o644)
	os.WriteFile(filepath.Join(c.Dir(), "README"), []byte("not ours"), 0o644)
	n, err := c.Clear()
	if err != nil || n != 3 {
		t.Fatalf("Clear = %d, %v; want 3", n, err)
	}
	des, _ := os.ReadDir(c.Dir())
	if len(des) != 1 || des[0].Name() != "README" {
		t.Fatalf("left %v, want only README", des)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	home := t.TempDir()
	cases := []struct {
		gpukit, xdg, home, want string
		fail                    bool
	}{
		{"/g/c", "/x", home, "/g/c", false},
		{"", "/x", home, "/x/gpukit/kernels", false},
		{"", "relative/xdg", home, filepath.Join(home, ".cache/gpukit/kernels"), false},
		{"", "", home, filepath.Join(home, ".cache/gpukit/kernels"), false},
		{"", "", "", "", true},
	}
	for _, tc := range cases {
		t.Setenv("GPUKIT_CACHE_DIR", tc.gpukit)
		t.Setenv("XDG_CACHE_HOME", tc.xdg)
		t.Setenv("HOME", tc.home)
		got, err := DefaultCacheDir()
		if tc.fail {
			if !errors.Is(err, ErrNoCacheDir) {
				t.Errorf("%+v: got %q, %v; want ErrNoCacheDir", tc, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: got %q, %v; want %q", tc, got, err, tc.want)
		}
	}
}

func FuzzDecodeEntry(f *testing.F) {
	k := Key([]byte("seed"), nil, "13.0", "sm_90a")
	f.Add(encodeEntry(k, []byte("payload")))
	f.Add(encodeEntry(k, nil))
	f.Add([]byte(entryMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeEntry(b, k)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if !bytes.Equal(encodeEntry(k, p), b) {
			t.Fatal("accepted entry does not re-encode to the same bytes")
		}
	})
}
