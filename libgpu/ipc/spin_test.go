package ipc

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// withSpin runs the rest of the test in spin mode mode.
func withSpin(t *testing.T, mode int32) {
	t.Helper()
	old := spinMode.Swap(mode)
	t.Cleanup(func() { spinMode.Store(old) })
}

func TestSpinPolicy(t *testing.T) {
	withSpin(t, spinAuto)
	old := runtime.GOMAXPROCS(2 * spinCoresPer)
	defer runtime.GOMAXPROCS(old)

	// Two slots with 2*spinCoresPer procs; a third spinner is refused.
	var a, b, c spinState
	if !a.want() || !b.want() {
		t.Fatal("spinning refused with free slots")
	}
	if c.want() {
		t.Fatal("a third spinner got a slot of two")
	}
	a.done(true)
	if !c.want() {
		t.Fatal("a freed slot was not given")
	}
	b.done(true)
	c.done(true)
	if n := spinners.Load(); n != 0 {
		t.Fatalf("%d spinners left", n)
	}

	// After spinMisses misses in a row a connection spins only on every
	// spinProbe-th Recv; a hit puts it back to spinning every time.
	var s spinState
	for range spinMisses {
		if !s.want() {
			t.Fatal("refused before missing")
		}
		s.done(false)
	}
	spun := 0
	for range 3 * spinProbe {
		if s.want() {
			spun++
			s.done(false)
		}
	}
	if spun != 3 {
		t.Fatalf("spun %d times in %d Recvs while missing, want 3", spun, 3*spinProbe)
	}
	for !s.want() {
	}
	s.done(true)
	for range 2 * spinMisses {
		if !s.want() {
			t.Fatal("refused after a hit")
		}
		s.done(true)
	}

	// Too few procs: no spinning at all.
	runtime.GOMAXPROCS(spinCoresPer - 1)
	var d spinState
	if d.want() {
		t.Fatal("spinning with fewer than spinCoresPer procs")
	}
	withSpin(t, spinAlways)
	if !d.want() {
		t.Fatal("spinAlways refused")
	}
	d.done(true)
	withSpin(t, spinNever)
	runtime.GOMAXPROCS(8 * spinCoresPer)
	if d.want() {
		t.Fatal("spinNever spun")
	}
}

// TestSpinningRecv sends messages, some with fds, from another goroutine
// while the reader spins: whether a message is there at once, comes while
// spinning or after the reader parked, it arrives whole, its fds open and
// close-on-exec, and the end of the connection reads as io.EOF.
func TestSpinningRecv(t *testing.T) {
	withSpin(t, spinAlways)
	a, b := pair(t)
	r := rand.New(rand.NewPCG(5, uint64(rand.Int64())))
	const n = 200
	payloads := make([][]byte, n)
	for i := range payloads {
		payloads[i] = make([]byte, r.IntN(4096))
		for j := range payloads[i] {
			payloads[i][j] = byte(r.Uint32())
		}
	}
	sent := make(chan error, 1)
	go func() {
		for i, p := range payloads {
			body, _ := MarshalBody(p)
			var fds []int
			if i%3 == 0 {
				fd, err := unix.MemfdCreate("spin-test", unix.MFD_CLOEXEC)
				if err != nil {
					sent <- err
					return
				}
				unix.Pwrite(fd, p, 0)
				fds = []int{fd}
			}
			err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: uint64(i + 1), Op: "put", Body: body}, fds...)
			closeFDs(fds)
			if err != nil {
				sent <- err
				return
			}
			for range r.IntN(3) {
				runtime.Gosched()
			}
		}
		sent <- a.CloseWrite()
	}()
	for i, p := range payloads {
		m, fds, err := b.recv(true)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		var back []byte
		if err := UnmarshalBody(m.Body, &back); err != nil || !bytes.Equal(back, p) || m.ID != uint64(i+1) {
			t.Fatalf("message %d changed in transit (%v)", i, err)
		}
		if want := btoi(i%3 == 0); len(fds) != want {
			t.Fatalf("message %d: %d fds, want %d", i, len(fds), want)
		}
		for _, fd := range fds {
			flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			if err != nil || flags&unix.FD_CLOEXEC == 0 {
				t.Errorf("message %d: fd flags %#x %v, want close-on-exec", i, flags, err)
			}
			got := make([]byte, len(p))
			if _, err := unix.Pread(fd, got, 0); err != nil || !bytes.Equal(got, p) {
				t.Errorf("message %d: fd holds other bytes (%v)", i, err)
			}
		}
		closeFDs(fds)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.recv(true); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v", err)
	}
	if n := spinners.Load(); n != 0 {
		t.Fatalf("%d spinners left", n)
	}
}

// TestSpinningRecvClosed closes a connection while its reader spins or
// waits: the read ends with io.EOF.
func TestSpinningRecvClosed(t *testing.T) {
	withSpin(t, spinAlways)
	for range 20 {
		a, b, err := Pair()
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			_, _, err := b.recv(true)
			got <- err
		}()
		runtime.Gosched()
		b.Close()
		if err := <-got; !errors.Is(err, io.EOF) {
			t.Fatalf("recv on a closed conn: %v", err)
		}
		a.Close()
	}
	if n := spinners.Load(); n != 0 {
		t.Fatalf("%d spinners left", n)
	}
}

// TestServerClientSpinning is TestServerClient with spinning forced on in
// both the client and the server.
func TestServerClientSpinning(t *testing.T) {
	withSpin(t, spinAlways)
	TestServerClient(t)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
