package server

import (
	"path/filepath"
	"testing"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// benchClient starts a host daemon in this process and returns a client of
// it holding one allocation, so its slab stays mapped.
func benchClient(b *testing.B) *pool.Client {
	path := filepath.Join(b.TempDir(), "pool.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		b.Fatal(err)
	}
	p := New(Config{})
	srv := &ipc.Server{Handler: p}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	c, err := pool.Dial(path)
	if err != nil {
		b.Fatal(err)
	}
	hold, err := c.Alloc("", 256)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		hold.Free()
		c.Close()
		srv.Shutdown()
		if err := <-done; err != nil {
			b.Errorf("serve: %v", err)
		}
		p.Close()
	})
	return c
}

// BenchmarkAllocFree is the issue-4 round trip on the host backend: Alloc
// (one request and its reply) then Free (one message, not waited for) of
// 4 KiB in an already-mapped slab, through a real socket to a daemon in this
// process. gpukit-poolbench measures the same across processes.
func BenchmarkAllocFree(b *testing.B) {
	c := benchClient(b)
	b.ReportAllocs()
	for b.Loop() {
		buf, err := c.Alloc("", 4096)
		if err != nil {
			b.Fatal(err)
		}
		if err := buf.Free(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocFreeParallel is BenchmarkAllocFree from several goroutines
// sharing one client, so calls overlap on the connection.
func BenchmarkAllocFreeParallel(b *testing.B) {
	c := benchClient(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			buf, err := c.Alloc("", 4096)
			if err != nil {
				b.Error(err)
				return
			}
			if err := buf.Free(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
