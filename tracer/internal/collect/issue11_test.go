package collect

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/trace"
)

// Item 10: a gpupool client given a tracer's socket fails at once, within
// its deadline, saying whose socket it reached; the collector is unharmed.
func TestPoolClientOnTracerSocket(t *testing.T) {
	f := start(t)
	_, err := pool.DialOptions(f.sock, pool.Options{Timeout: time.Minute})
	if !errors.Is(err, pool.ErrProtocol) || !strings.Contains(err.Error(), "tracer collector") || !strings.Contains(err.Error(), "not a gpupool socket") {
		t.Fatalf("pool client on a tracer socket: %v", err)
	}
	// A raw ipc client is told the same.
	c, err := ipc.Dial(f.sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := ipc.NewClient(c)
	defer cl.Close()
	if _, err := cl.Call(t.Context(), "stats", nil, nil); !errors.Is(err, ipc.ErrMalformed) || !strings.Contains(err.Error(), "tracer") {
		t.Fatalf("ipc client: %v", err)
	}
	// Trace clients are still served.
	tr := trace.Open(f.sock, "after", trace.Options{})
	tr.Instant("c", "still-here")
	tr.Close()
	got := f.stop(t)
	if st := f.c.Stats(); st.Rejected != 2 {
		t.Fatalf("%d batches rejected, want the 2 hellos", st.Rejected)
	}
	for _, e := range got.Events {
		if e.Name == "still-here" {
			return
		}
	}
	t.Fatal("the trace client's event is missing")
}

// Past MaxConns a connection is closed at once; the others are served.
func TestCollectorMaxConns(t *testing.T) {
	f := start(t)
	f.c.mu.Lock()
	f.c.MaxConns = 2
	f.c.mu.Unlock()
	a, b := dial(t, f.sock), dial(t, f.sock)
	defer a.Close()
	defer b.Close()
	// Both are being served once a batch of each has arrived.
	for _, c := range []interface{ Write([]byte) (int, error) }{a, b} {
		c.Write(trace.AppendBatchHeader(nil, self, 0, 0))
	}
	for deadline := time.Now().Add(10 * time.Second); f.c.Stats().Batches < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("batches not read")
		}
	}
	c := dial(t, f.sock)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 10)); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("third connection: %d bytes, %v; want it closed", n, err)
	}
	a.Close()
	b.Close()
	f.stop(t)
}
