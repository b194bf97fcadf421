package kernels

import (
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"gpukit/libgpu/trace"
)

// TestCompileSpans: with a tracer as the Default, every Compile is a span
// "compile" saying whether the cache hit, and the collector receives it.
func TestCompileSpans(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "t.sock")
	l, err := net.ListenUnix(trace.Network, &net.UnixAddr{Name: sock, Net: trace.Network})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan trace.Record, 64)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, trace.MaxBatch+1)
		for {
			n, err := c.Read(buf)
			if err != nil || n == 0 {
				close(got)
				return
			}
			b, err := trace.DecodeBatch(buf[:n])
			if err != nil {
				t.Error(err)
			}
			for _, r := range b.Records {
				if r.Kind == trace.KindSpan {
					got <- r
				}
			}
		}
	}()
	tr := trace.Open(sock, "kernels-test", trace.Options{})
	trace.SetDefault(tr)
	c := NewCompiler(&fakeNVRTC{version: "13.0"}, openTemp(t))
	src := Source{Name: "k" + strconv.Itoa(rand.IntN(1000)) + ".cu", Code: []byte("__global__ void k() {}")}
	want := []string{"miss", "hit", "hit"}
	for range want {
		if _, err := c.Compile(src, Options{Arch: "sm_90a"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Compile(Source{Name: "bad.cu", Code: []byte("#error no")}, Options{Arch: "sm_90a"}); err == nil {
		t.Fatal("bad source compiled")
	}
	want = append(want, "miss")
	tr.Close()
	i := 0
	for r := range got {
		args := map[string]string{}
		for _, a := range r.Args[:r.NArgs] {
			args[a.Key] = a.Str
		}
		if r.Cat != "kernels" || r.Name != "compile" || args["cache"] != want[i] || args["arch"] != "sm_90a" {
			t.Fatalf("span %d: %+v, args %v", i, r, args)
		}
		if (i == 3) != (args["error"] != "") {
			t.Fatalf("span %d: error arg %q", i, args["error"])
		}
		i++
	}
	if i != len(want) {
		t.Fatalf("%d compile spans, want %d", i, len(want))
	}
}
