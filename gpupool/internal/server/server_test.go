package server

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
)

// TestMain doubles as the child process of the multi-process tests: with
// GPUPOOL_TEST_CHILD set, the test binary runs child() instead of tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("GPUPOOL_TEST_CHILD"); mode != "" {
		if err := child(mode, os.Getenv("GPUPOOL_TEST_SOCKET")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child modes:
//
//	hold: allocate the sizes in GPUPOOL_TEST_SIZES (comma separated; the
//	      first one named "held"), fill them, print "ready", block on stdin.
//	read: open GPUPOOL_TEST_NAME, print its bytes in hex, then write the
//	      reversed bytes into it and print "done".
func child(mode, path string) error {
	c, err := pool.Dial(path)
	if err != nil {
		return err
	}
	defer c.Close()
	switch mode {
	case "hold":
		for i, s := range strings.Split(os.Getenv("GPUPOOL_TEST_SIZES"), ",") {
			n, _ := strconv.ParseInt(s, 10, 64)
			name := ""
			if i == 0 {
				name = "held"
			}
			b, err := c.Alloc(name, n)
			if err != nil {
				return err
			}
			for j := range b.Bytes() {
				b.Bytes()[j] = byte(j)
			}
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return nil
	case "read":
		b, err := c.Open(os.Getenv("GPUPOOL_TEST_NAME"))
		if err != nil {
			return err
		}
		mem := b.Bytes()
		fmt.Println(hex.EncodeToString(mem))
		n := len(mem)
		rev := make([]byte, n)
		for i := range mem {
			rev[i] = mem[n-1-i]
		}
		copy(mem, rev)
		fmt.Println("done")
		return b.Free()
	}
	return fmt.Errorf("unknown mode %q", mode)
}

func childCmd(t *testing.T, path, mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GPUPOOL_TEST_CHILD="+mode, "GPUPOOL_TEST_SOCKET="+path)
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t.Cleanup(func() {
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("child stderr: %s", stderr.String())
		}
	})
	return cmd
}

func startPool(t *testing.T, cfg Config) (string, *Pool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pool.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	p := New(cfg)
	srv := &ipc.Server{Handler: p}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		p.Close()
	})
	return path, p
}

func dial(t *testing.T, path string) *pool.Client {
	t.Helper()
	c, err := pool.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

func TestShareAcrossProcesses(t *testing.T) {
	path, _ := startPool(t, Config{})
	c := dial(t, path)
	n := 1000 + rand.IntN(5000)
	want := randBytes(n)
	b, err := c.Alloc("weights", int64(n))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Device().CopyIn(b, 0, want); err != nil {
		t.Fatal(err)
	}
	cmd := childCmd(t, path, "read", "GPUPOOL_TEST_NAME=weights")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 2 || lines[1] != "done" {
		t.Fatalf("child said %q", out)
	}
	got, _ := hex.DecodeString(lines[0])
	if !bytes.Equal(got, want) {
		t.Fatalf("child read other bytes than were written")
	}
	// The child's writes are visible here without a copy.
	back := make([]byte, n)
	c.Device().CopyOut(back, b, 0)
	for i := range back {
		if back[i] != want[n-1-i] {
			t.Fatalf("byte %d: child wrote %d, want %d", i, back[i], want[n-1-i])
		}
	}
}

func waitStats(t *testing.T, c *pool.Client, ok func(pool.Stats) bool) pool.Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never reached the expected state: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKilledClientReleases(t *testing.T) {
	path, _ := startPool(t, Config{SlabSize: 1 << 20})
	c := dial(t, path)
	// Make the shared slab exist, so the baseline has it.
	warm, err := c.Alloc("", 10)
	if err != nil {
		t.Fatal(err)
	}
	warm.Free()
	base, _ := c.Stats()

	cmd := childCmd(t, path, "hold", "GPUPOOL_TEST_SIZES=5000,300,70000,3000000")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	held, _ := c.Stats()
	if held.Allocations != base.Allocations+4 || held.Used <= base.Used || held.Slabs != base.Slabs+1 || held.Named != 1 {
		t.Fatalf("while held: %+v (base %+v)", held, base)
	}
	if _, err := c.Open("held"); err != nil {
		t.Fatalf("open the child's named buffer: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// "held" is still leased here; everything else returns.
	s := waitStats(t, c, func(s pool.Stats) bool { return s.Allocations == base.Allocations+1 })
	if s.Slabs != base.Slabs || s.Clients != base.Clients || s.Named != 1 {
		t.Fatalf("after kill: %+v (base %+v)", s, base)
	}
	bufs, _ := c.Ls()
	if len(bufs) != 1 || bufs[0].Name != "held" || bufs[0].Leases != 1 {
		t.Fatalf("ls after kill: %+v", bufs)
	}
}

func TestKilledClientReleasesEverything(t *testing.T) {
	path, _ := startPool(t, Config{SlabSize: 1 << 20})
	c := dial(t, path)
	warm, _ := c.Alloc("", 10)
	warm.Free()
	base, _ := c.Stats()
	cmd := childCmd(t, path, "hold", "GPUPOOL_TEST_SIZES=256,1,4000000,9999")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	s := waitStats(t, c, func(s pool.Stats) bool { return s.Clients == base.Clients && s.Allocations == base.Allocations })
	s.Peak, base.Peak = 0, 0
	if s != base {
		t.Fatalf("after kill: %+v, baseline %+v", s, base)
	}
}

func TestBadRequestsKeepOthersServed(t *testing.T) {
	path, _ := startPool(t, Config{})
	good := dial(t, path)
	keep, err := good.Alloc("keep", 4096)
	if err != nil {
		t.Fatal(err)
	}
	want := randBytes(4096)
	copy(keep.Bytes(), want)

	frame := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	valid, _ := ipc.Encode(&ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 1, Op: pool.OpStats})
	cases := []struct {
		name      string
		frame     []byte
		want      error
		staysOpen bool
	}{
		{"garbage", []byte{0xc1, 0xff, 0x00}, ipc.ErrMalformed, false},
		{"truncated", valid[:len(valid)-3], ipc.ErrMalformed, false},
		{"oversized", make([]byte, ipc.MaxMessage+1), ipc.ErrTooLarge, false},
		{"wrong version", frame(map[string]any{"v": ipc.Version + 7, "t": 1, "id": 3, "op": "stats"}), ipc.ErrVersion, false},
		{"unknown op", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 4, "op": "explode"}), ipc.ErrUnknownOp, true},
		{"bad body", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 5, "op": "alloc", "body": []byte{0xc1}}), ipc.ErrMalformed, true},
		{"body of wrong type", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 6, "op": "alloc", "body": map[string]any{"size": "big"}}), ipc.ErrMalformed, true},
		{"negative size", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 7, "op": "alloc", "body": map[string]any{"size": -5}}), pool.ErrBadSize, true},
		{"huge size", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 8, "op": "alloc", "body": map[string]any{"size": int64(1) << 50}}), pool.ErrBadSize, true},
		{"free of nothing", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 9, "op": "free", "body": map[string]any{"handle": 77}}), pool.ErrNoSuchLease, true},
		{"reply to server", frame(map[string]any{"v": ipc.Version, "t": 2, "id": 10, "op": "stats"}), ipc.ErrMalformed, false},
	}
	for _, tc := range cases {
		conn, err := ipc.Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.SendRaw(tc.frame); err != nil {
			t.Fatalf("%s: send: %v", tc.name, err)
		}
		m, fds, err := conn.Recv()
		if err != nil || len(fds) != 0 {
			t.Fatalf("%s: no reply: %v", tc.name, err)
		}
		if m.Err == nil {
			t.Fatalf("%s: reply is not an error: %+v", tc.name, m)
		}
		if got := ipc.FromWire(m.Err); !errors.Is(got, tc.want) {
			t.Fatalf("%s: error %v, want %v", tc.name, got, tc.want)
		}
		if tc.staysOpen {
			if err := conn.SendRaw(valid); err != nil {
				t.Fatal(err)
			}
			if m, _, err := conn.Recv(); err != nil || m.Err != nil || m.ID != 1 {
				t.Fatalf("%s: connection not usable after the error: %+v %v", tc.name, m, err)
			}
		} else if _, _, err := conn.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: connection left open: %v", tc.name, err)
		}
		conn.Close()
		// The other client is still served, and its memory is intact.
		b, err := good.Alloc("", 100)
		if err != nil {
			t.Fatalf("after %s: %v", tc.name, err)
		}
		b.Free()
		if !bytes.Equal(keep.Bytes(), want) {
			t.Fatalf("after %s: another client's buffer changed", tc.name)
		}
	}
	s := waitStats(t, good, func(s pool.Stats) bool { return s.Clients == 1 })
	if s.Allocations != 1 {
		t.Fatalf("stats after bad clients left: %+v", s)
	}
}

func TestNamedBuffers(t *testing.T) {
	path, _ := startPool(t, Config{})
	a := dial(t, path)
	b := dial(t, path)
	if _, err := b.Open("nope"); !errors.Is(err, pool.ErrNoSuchName) {
		t.Fatalf("open missing: %v", err)
	}
	x, err := a.Alloc("x", 512)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc("x", 8); !errors.Is(err, pool.ErrNameTaken) {
		t.Fatalf("duplicate name: %v", err)
	}
	for _, bad := range []string{"bad//name", "/abs", "trail/", "run/../x", "ctl\x01"} {
		if _, err := a.Alloc(bad, 8); !errors.Is(err, pool.ErrBadName) {
			t.Fatalf("bad name %q: %v", bad, err)
		}
	}
	nested, err := a.Alloc("run1/params/fc0.weight", 8)
	if err != nil {
		t.Fatalf("path-like name: %v", err)
	}
	if err := nested.Free(); err != nil {
		t.Fatal(err)
	}
	xb, err := b.Open("x")
	if err != nil {
		t.Fatal(err)
	}
	// The creator frees its lease; the opener's lease keeps the buffer and
	// the name.
	x.Bytes()[7] = 42
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
	if err := x.Free(); err == nil {
		t.Fatal("double free accepted")
	}
	if xb.Bytes()[7] != 42 {
		t.Fatal("opener does not see the creator's write")
	}
	if _, err := a.Open("x"); err != nil {
		t.Fatalf("name gone while a lease holds the buffer: %v", err)
	}
	xb.Free()
	// a still holds one lease from the Open above; free by name unbinds.
	if err := b.FreeName("x"); err != nil {
		t.Fatalf("free by name (same uid): %v", err)
	}
	if _, err := b.Open("x"); !errors.Is(err, pool.ErrNoSuchName) {
		t.Fatalf("open after free by name: %v", err)
	}
	// A kept buffer outlives its creator's connection.
	k, err := a.AllocKeep("kept", 300)
	if err != nil {
		t.Fatal(err)
	}
	copy(k.Bytes(), "persist")
	a.Close()
	kb, err := b.Open("kept")
	if err != nil {
		t.Fatalf("kept buffer gone with its creator: %v", err)
	}
	if string(kb.Bytes()[:7]) != "persist" {
		t.Fatalf("kept buffer reads %q", kb.Bytes()[:7])
	}
	kb.Free()
	if err := b.FreeName("kept"); err != nil {
		t.Fatal(err)
	}
	// a's connection ends asynchronously on the daemon's side.
	s := waitStats(t, b, func(s pool.Stats) bool { return s.Clients == 1 })
	if s.Allocations != 0 || s.Used != 0 || s.Named != 0 {
		t.Fatalf("after freeing everything: %+v", s)
	}
}

func TestSlabsMappedOnceAndLargeAllocations(t *testing.T) {
	const slab = 1 << 20
	path, _ := startPool(t, Config{SlabSize: slab})
	c := dial(t, path)
	b1, _ := c.Alloc("", 1000)
	b2, _ := c.Alloc("", 3000)
	s1, s2 := b1.Share(), b2.Share()
	if s1.FD != s2.FD || s1.SlabSize != slab || s2.Offset%Align != 0 {
		t.Fatalf("shares %+v %+v", s1, s2)
	}
	if int64(b2.Ptr()-b1.Ptr()) != s2.Offset-s1.Offset {
		t.Fatalf("buffers of one slab are not views of one mapping")
	}
	big, err := c.Alloc("", 3*slab+5)
	if err != nil {
		t.Fatal(err)
	}
	if big.Share().FD == s1.FD || big.Share().SlabSize < 3*slab+5 {
		t.Fatalf("large allocation share %+v", big.Share())
	}
	st, _ := c.Stats()
	if st.Slabs != 2 {
		t.Fatalf("slabs %d, want 2", st.Slabs)
	}
	big.Free()
	st, _ = c.Stats()
	if st.Slabs != 1 || st.Used != device256(1000)+device256(3000) {
		t.Fatalf("after freeing the large allocation: %+v", st)
	}
	if st.Peak < 3*slab {
		t.Fatalf("peak %d", st.Peak)
	}
}

func device256(n int64) int64 { return (n + Align - 1) / Align * Align }

func TestConcurrentClient(t *testing.T) {
	path, _ := startPool(t, Config{SlabSize: 256 << 10})
	c := dial(t, path)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), rand.Uint64()))
			for i := 0; i < 40; i++ {
				n := 1 + r.Int64N(40000)
				b, err := c.Alloc("", n)
				if err != nil {
					t.Error(err)
					return
				}
				fill := byte(g*40 + i)
				mem := b.Bytes()
				for j := range mem {
					mem[j] = fill
				}
				for j := range mem {
					if mem[j] != fill {
						t.Errorf("goroutine %d: buffer overwritten by another allocation", g)
						return
					}
				}
				if r.IntN(3) > 0 {
					if err := b.Free(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	ls, err := c.Ls()
	if err != nil {
		t.Fatal(err)
	}
	// No two live allocations overlap.
	bySlab := map[uint64][][2]int64{}
	for _, b := range ls {
		bySlab[b.Slab] = append(bySlab[b.Slab], [2]int64{b.Offset, b.Offset + device256(b.Size)})
	}
	for slab, rs := range bySlab {
		for i := range rs {
			for j := i + 1; j < len(rs); j++ {
				if rs[i][0] < rs[j][1] && rs[j][0] < rs[i][1] {
					t.Fatalf("slab %d: %v overlaps %v", slab, rs[i], rs[j])
				}
			}
		}
	}
}

func TestUnreachable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.sock")
	_, err := pool.Dial(path)
	if !errors.Is(err, pool.ErrUnreachable) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), "gpupool serve --socket "+path) {
		t.Fatalf("dial of a missing socket: %v", err)
	}
}

func TestQuota(t *testing.T) {
	uid := uint32(os.Getuid())
	path, _ := startPool(t, Config{Quota: map[uint32]int64{uid: 4096, uid + 1: 1}})
	c := dial(t, path)
	b, err := c.Alloc("", 4000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc("", 200); !errors.Is(err, pool.ErrQuota) {
		t.Fatalf("over quota: %v", err)
	}
	// The refusal changes nothing and the connection goes on.
	s, _ := c.Stats()
	if s.Allocations != 1 || s.Used != 4096 {
		t.Fatalf("stats after refusal: %+v", s)
	}
	b.Free()
	if _, err := c.Alloc("", 4096); err != nil {
		t.Fatalf("within quota after free: %v", err)
	}
}

func TestAllowUID(t *testing.T) {
	uid := uint32(os.Getuid())
	path, _ := startPool(t, Config{AllowUID: []uint32{uid + 1}})
	_, err := pool.Dial(path)
	if !errors.Is(err, pool.ErrPermission) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("dial by a uid not allowed: %v", err)
	}
	path2, _ := startPool(t, Config{AllowUID: []uint32{uid}})
	c := dial(t, path2)
	if _, err := c.Alloc("", 10); err != nil {
		t.Fatalf("allowed uid: %v", err)
	}
}

func TestIdleSlabsReleased(t *testing.T) {
	path, _ := startPool(t, Config{SlabSize: 1 << 20, Idle: time.Millisecond})
	c := dial(t, path)
	b, err := c.Alloc("", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := c.Stats(); s.Slabs != 1 {
		t.Fatalf("slabs %d", s.Slabs)
	}
	b.Free()
	waitStats(t, c, func(s pool.Stats) bool { return s.Slabs == 0 && s.Reserved == 0 })
	// A new allocation gets a new slab (a new id, its fd sent again).
	b2, err := c.Alloc("", 1000)
	if err != nil {
		t.Fatal(err)
	}
	b2.Bytes()[0] = 1
	if b2.Share().FD == b.Share().FD {
		t.Fatalf("new slab reuses the old fd %d", b.Share().FD)
	}
}
