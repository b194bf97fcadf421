package device

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestHostAllocIsSharedMemfd(t *testing.T) {
	h := NewHost()
	b, err := h.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if b.Size() != 1000 || len(b.Bytes()) != 1000 {
		t.Fatalf("size %d, bytes %d", b.Size(), len(b.Bytes()))
	}
	sh := b.Share()
	if sh.Kind != ShareMemfd || sh.SlabSize%int64(unix.Getpagesize()) != 0 {
		t.Fatalf("share %+v", sh)
	}
	// A second mapping of the same fd sees the same bytes.
	if err := h.CopyIn(b, 10, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	other, err := MapFD(sh.FD, sh.SlabSize)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(other)
	if string(other[10:15]) != "hello" {
		t.Fatalf("second mapping reads %q", other[10:15])
	}
	other[20] = 7
	out := make([]byte, 1)
	if err := h.CopyOut(out, b, 20); err != nil || out[0] != 7 {
		t.Fatalf("copy out %v %v", out, err)
	}
}

func TestHostBounds(t *testing.T) {
	h := NewHost()
	if _, err := h.Alloc(0); !errors.Is(err, ErrBadSize) {
		t.Fatalf("alloc 0: %v", err)
	}
	b, _ := h.Alloc(16)
	if err := h.CopyIn(b, 10, make([]byte, 7)); !errors.Is(err, ErrRange) {
		t.Fatalf("overflow copy: %v", err)
	}
	v, err := b.View(4, 8)
	if err != nil || v.Size() != 8 || v.Share().Offset != 4 {
		t.Fatalf("view %v %+v", err, v)
	}
	if _, err := b.View(10, 8); !errors.Is(err, ErrRange) {
		t.Fatalf("bad view: %v", err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); !errors.Is(err, ErrFreed) {
		t.Fatalf("double free: %v", err)
	}
	if err := h.CopyIn(b, 0, []byte{1}); !errors.Is(err, ErrFreed) {
		t.Fatalf("copy after free: %v", err)
	}
}
