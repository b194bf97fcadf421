package ipc

import (
	"context"
	"path/filepath"
	"testing"
)

// benchEcho starts a Server of the tests' echo handler in this process and
// returns a client of it.
func benchEcho(b *testing.B) *Client {
	path := filepath.Join(b.TempDir(), "s.sock")
	l, err := Listen(path)
	if err != nil {
		b.Fatal(err)
	}
	srv := &Server{Handler: &echo{}}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	conn, err := Dial(path)
	if err != nil {
		b.Fatal(err)
	}
	c := NewClient(conn)
	b.Cleanup(func() {
		c.Close()
		srv.Shutdown()
		if err := <-done; err != nil {
			b.Errorf("serve: %v", err)
		}
	})
	return c
}

type benchBody struct {
	Handle uint64 `msgpack:"handle"`
	Size   int64  `msgpack:"size"`
}

// BenchmarkCall is one request and its reply over a unixpacket socket,
// served by a Server in this process.
func BenchmarkCall(b *testing.B) {
	c := benchEcho(b)
	req := benchBody{Handle: 7, Size: 4096}
	b.ReportAllocs()
	for b.Loop() {
		var resp benchBody
		if _, err := c.Call(context.Background(), "echo", req, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallParallel is BenchmarkCall from several goroutines at once,
// so calls overlap on the connection.
func BenchmarkCallParallel(b *testing.B) {
	c := benchEcho(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := benchBody{Handle: 7, Size: 4096}
		for pb.Next() {
			var resp benchBody
			if _, err := c.Call(context.Background(), "echo", req, &resp); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCallNoSpin is BenchmarkCall with spinning off (spin.go) in the
// client and the server, for comparison: on a machine with spinCoresPer
// procs or more, the difference is what spinning saves per round trip; on
// a smaller one neither spins.
func BenchmarkCallNoSpin(b *testing.B) {
	old := spinMode.Swap(spinNever)
	defer spinMode.Store(old)
	BenchmarkCall(b)
}

// BenchmarkCallSpin is BenchmarkCall with spinning on whatever the number
// of procs (spinAlways).
func BenchmarkCallSpin(b *testing.B) {
	old := spinMode.Swap(spinAlways)
	defer spinMode.Store(old)
	BenchmarkCall(b)
}
