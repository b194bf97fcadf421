package server

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
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

func TestShareAcrossProcesses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{})
		c := dial(t, path)
		n := 1000 + rand.IntN(5000)
		want := randBytes(n)
		b, err := c.Alloc("weights", int64(n))
		if err != nil {
			t.Fatal(err)
		}
		write(t, c, b, 0, want)
		out, err := childCmd(t, path, "read", "GPUPOOL_TEST_NAME=weights").Output()
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
		// The child's writes are visible here without a copy through the daemon.
		back := read(t, c, b, 0, int64(n))
		for i := range back {
			if back[i] != want[n-1-i] {
				t.Fatalf("byte %d: child wrote %d, want %d", i, back[i], want[n-1-i])
			}
		}
	})
}

func TestKilledClientReleases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		slab := slabFor(be)
		path, _ := startPool(t, be, testConfig{SlabSize: slab})
		c := dial(t, path)
		// Make the shared slab exist, so the baseline has it.
		warm, err := c.Alloc("", 10)
		if err != nil {
			t.Fatal(err)
		}
		warm.Free()
		base, _ := c.Stats()
		cmd := startHolder(t, path, "5000,300,70000,"+itoa(3*slab))
		held, _ := c.Stats()
		if held.Allocations != base.Allocations+4 || held.Used <= base.Used || held.Slabs != base.Slabs+1 || held.Named != 1 {
			t.Fatalf("while held: %+v (base %+v)", held, base)
		}
		if _, err := c.Open("held"); err != nil {
			t.Fatalf("open the child's named buffer: %v", err)
		}
		cmd.Process.Signal(syscall.SIGKILL)
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
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestKilledClientReleasesEverything(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		slab := slabFor(be)
		path, _ := startPool(t, be, testConfig{SlabSize: slab})
		c := dial(t, path)
		warm, _ := c.Alloc("", 10)
		warm.Free()
		base, _ := c.Stats()
		cmd := startHolder(t, path, "256,1,"+itoa(4*slab)+",9999")
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		s := waitStats(t, c, func(s pool.Stats) bool { return s.Clients == base.Clients && s.Allocations == base.Allocations })
		s.Peak, base.Peak = 0, 0
		if s != base {
			t.Fatalf("after kill: %+v, baseline %+v", s, base)
		}
	})
}

func TestBadRequestsKeepOthersServed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{})
		good := dial(t, path)
		keep, err := good.Alloc("keep", 4096)
		if err != nil {
			t.Fatal(err)
		}
		want := randBytes(4096)
		write(t, good, keep, 0, want)

		frame := func(v any) []byte {
			b, err := msgpack.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		req := func(id int, op string, body any) []byte {
			m := map[string]any{"v": ipc.Version, "t": 1, "id": id, "op": op}
			if body != nil {
				m["body"] = body
			}
			return frame(m)
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
			{"empty map", frame(map[string]any{}), ipc.ErrVersion, false},
			{"oversized", make([]byte, ipc.MaxMessage+1), ipc.ErrTooLarge, false},
			{"wrong version", frame(map[string]any{"v": ipc.Version + 7, "t": 1, "id": 3, "op": "stats"}), ipc.ErrVersion, false},
			{"version zero", frame(map[string]any{"v": 0, "t": 1, "id": 3, "op": "stats"}), ipc.ErrVersion, false},
			{"unknown op", req(4, "explode", nil), ipc.ErrUnknownOp, true},
			{"bad body", frame(map[string]any{"v": ipc.Version, "t": 1, "id": 5, "op": "alloc", "body": []byte{0xc1}}), ipc.ErrMalformed, true},
			{"body of wrong type", req(6, "alloc", map[string]any{"size": "big"}), ipc.ErrMalformed, true},
			{"negative size", req(7, "alloc", map[string]any{"size": -5}), pool.ErrBadSize, true},
			{"huge size", req(8, "alloc", map[string]any{"size": int64(1) << 50}), pool.ErrBadSize, true},
			{"free of nothing", req(9, "free", map[string]any{"handle": 77}), pool.ErrNoSuchLease, true},
			{"seal of nothing", req(10, "seal", map[string]any{"handle": 77}), pool.ErrNoSuchLease, true},
			{"event of nothing", req(11, "event", map[string]any{"handle": 77}), pool.ErrNoSuchLease, true},
			{"shape too long", req(12, "alloc", map[string]any{"size": 8, "shape": make([]int64, 40)}), ipc.ErrBadRequest, true},
			{"negative dim", req(13, "alloc", map[string]any{"size": 8, "shape": []int64{2, -1}}), ipc.ErrBadRequest, true},
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
			if !bytes.Equal(read(t, good, keep, 0, 4096), want) {
				t.Fatalf("after %s: another client's buffer changed", tc.name)
			}
		}
		s := waitStats(t, good, func(s pool.Stats) bool { return s.Clients == 1 })
		if s.Allocations != 1 {
			t.Fatalf("stats after bad clients left: %+v", s)
		}
	})
}

func TestNamedBuffers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{})
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
		for _, bad := range []string{"bad//name", "/abs", "trail/", "run/../x", "ctl\x01", strings.Repeat("n", pool.MaxNameLen+1)} {
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
		// The creator frees its lease; the opener's lease keeps the buffer.
		write(t, a, x, 7, []byte{42})
		if err := x.Free(); err != nil {
			t.Fatal(err)
		}
		if err := x.Free(); err == nil {
			t.Fatal("double free accepted")
		}
		if got := read(t, b, xb, 7, 1); got[0] != 42 {
			t.Fatal("opener does not see the creator's write")
		}
		if _, err := a.Open("x"); err != nil {
			t.Fatalf("name gone while a lease holds the buffer: %v", err)
		}
		xb.Free()
		// rm unbinds; a still holds one lease from the Open above.
		if err := b.Remove("x"); err != nil {
			t.Fatalf("rm (same uid): %v", err)
		}
		if _, err := b.Open("x"); !errors.Is(err, pool.ErrNoSuchName) {
			t.Fatalf("open after rm: %v", err)
		}

		// create → write → seal: open of an unsealed name fails at once,
		// or waits for the seal.
		w, err := a.Create("staged", 300, pool.CreateOptions{DType: "f32", Shape: []int64{5, 15}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Open("staged"); !errors.Is(err, pool.ErrNotSealed) {
			t.Fatalf("open of an unsealed buffer: %v", err)
		}
		if _, err := b.OpenWait("staged", 20*time.Millisecond); !errors.Is(err, pool.ErrNotSealed) {
			t.Fatalf("open past its wait: %v", err)
		}
		payload := randBytes(300)
		opened := make(chan *pool.Buffer, 1)
		go func() {
			ob, err := b.OpenWait("staged", time.Minute)
			if err != nil {
				t.Error(err)
			}
			opened <- ob
		}()
		write(t, a, w.Buffer, 0, payload)
		if err := w.Seal(); err != nil {
			t.Fatal(err)
		}
		ob := <-opened
		if ob == nil {
			t.FailNow()
		}
		if ob.DType() != "f32" || len(ob.Shape()) != 2 || ob.Shape()[1] != 15 || !ob.Sealed() {
			t.Fatalf("opened metadata: %q %v sealed=%v", ob.DType(), ob.Shape(), ob.Sealed())
		}
		if !bytes.Equal(read(t, b, ob.Buffer, 0, 300), payload) {
			t.Fatal("waiting opener reads other bytes than were sealed")
		}
		ls, _ := b.Ls()
		var info *pool.BufferInfo
		for i := range ls {
			if ls[i].Name == "staged" {
				info = &ls[i]
			}
		}
		if info == nil || info.DType != "f32" || !info.Kept || !info.Sealed || info.OwnerUID != uint32(os.Getuid()) || info.AgeMS < 0 {
			t.Fatalf("ls of staged: %+v", info)
		}
		ob.Free()
		// A waiting open of a name that is removed ends with no-such-name.
		u, err := a.Create("doomed", 64, pool.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { _, err := b.OpenWait("doomed", time.Minute); errc <- err }()
		time.Sleep(10 * time.Millisecond)
		u.Free()
		if err := a.Remove("doomed"); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, pool.ErrNoSuchName) {
			t.Fatalf("open waiting on a removed name: %v", err)
		}

		// A Created (kept) buffer outlives its creator's connection.
		k, err := a.Create("kept", 300, pool.CreateOptions{Sealed: true})
		if err != nil {
			t.Fatal(err)
		}
		write(t, a, k.Buffer, 0, []byte("persist"))
		a.Close()
		kb, err := b.Open("kept")
		if err != nil {
			t.Fatalf("kept buffer gone with its creator: %v", err)
		}
		if got := read(t, b, kb, 0, 7); string(got) != "persist" {
			t.Fatalf("kept buffer reads %q", got)
		}
		kb.Free()
		for _, n := range []string{"kept", "staged"} {
			if err := b.Remove(n); err != nil {
				t.Fatal(err)
			}
		}
		// a's connection ends asynchronously on the daemon's side.
		s := waitStats(t, b, func(s pool.Stats) bool { return s.Clients == 1 })
		if s.Allocations != 0 || s.Used != 0 || s.Named != 0 {
			t.Fatalf("after freeing everything: %+v", s)
		}
	})
}

func TestEphemeralTiesNamesToCreator(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{Ephemeral: true})
		a, err := pool.Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		b := dial(t, path)
		if _, err := a.Create("e", 64, pool.CreateOptions{Sealed: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Open("e"); err != nil {
			t.Fatal(err)
		}
		a.Close()
		// b's lease keeps the memory, but nothing keeps it once b lets go.
		waitStats(t, b, func(s pool.Stats) bool { return s.Clients == 1 })
		ls, _ := b.Ls()
		if len(ls) != 1 || ls[0].Kept {
			t.Fatalf("ls: %+v", ls)
		}
	})
}

func TestSlabsMappedOnceAndLargeAllocations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		slab := slabFor(be)
		path, _ := startPool(t, be, testConfig{SlabSize: slab})
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
		// Fragmentation: free bytes outside each slab's largest hole.
		b1.Free()
		st, _ = c.Stats()
		want := float64(device256(1000)) / float64(st.Free)
		if d := st.Fragmentation - want; d > 1e-12 || d < -1e-12 {
			t.Fatalf("fragmentation %v, want %v", st.Fragmentation, want)
		}
	})
}

func TestConcurrentClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{SlabSize: slabFor(be)})
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
					fill := bytes.Repeat([]byte{byte(g*40 + i)}, int(n))
					if err := c.Device().CopyIn(b, 0, fill); err != nil {
						t.Error(err)
						return
					}
					got := make([]byte, n)
					if err := c.Device().CopyOut(got, b, 0); err != nil || !bytes.Equal(got, fill) {
						t.Errorf("goroutine %d: buffer overwritten by another allocation (%v)", g, err)
						return
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
		checkNoOverlap(t, c)
	})
}

// checkNoOverlap fails if two live allocations share a byte.
func checkNoOverlap(t *testing.T, c *pool.Client) {
	t.Helper()
	ls, err := c.Ls()
	if err != nil {
		t.Fatal(err)
	}
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
	forEachBackend(t, func(t *testing.T, be backend) {
		uid := uint32(os.Getuid())
		path, _ := startPool(t, be, testConfig{Quota: map[uint32]int64{uid: 4096, uid + 1: 1}})
		c := dial(t, path)
		other := dial(t, path)
		b, err := c.Alloc("", 4000)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Alloc("", 200); !errors.Is(err, pool.ErrQuota) {
			t.Fatalf("over quota: %v", err)
		}
		// The refusal changes nothing and the connection goes on; another
		// connection is served (the quota is per uid, so it is refused too,
		// but its reads work).
		s, _ := other.Stats()
		if s.Allocations != 1 || s.Used != 4096 {
			t.Fatalf("stats after refusal: %+v", s)
		}
		b.Free()
		if _, err := c.Alloc("", 4096); err != nil {
			t.Fatalf("within quota after free: %v", err)
		}
	})
}

func TestLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		slab := slabFor(be)
		path, _ := startPool(t, be, testConfig{SlabSize: slab, Limit: 3 * slab})
		c := dial(t, path)
		a, err := c.Alloc("", slab) // fills slab 1
		if err != nil {
			t.Fatal(err)
		}
		e, err := c.Alloc("", 100) // slab 2
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Alloc("", 2*slab); !errors.Is(err, pool.ErrNoMemory) {
			t.Fatalf("over the limit: %v", err)
		}
		// An empty shared slab is released to make room.
		e.Free()
		big, err := c.Alloc("", 2*slab)
		if err != nil {
			t.Fatalf("after freeing: %v", err)
		}
		s, _ := c.Stats()
		if s.Reserved > 3*slab || s.Limit != 3*slab {
			t.Fatalf("stats: %+v", s)
		}
		// The client unmapped the released slab: a new small allocation
		// maps a new one and works.
		if _, err := c.Alloc("", 100); !errors.Is(err, pool.ErrNoMemory) {
			t.Fatalf("full: %v", err)
		}
		big.Free()
		a.Free()
		small, err := c.Alloc("", 100)
		if err != nil {
			t.Fatal(err)
		}
		write(t, c, small, 0, []byte("ok"))
	})
}

func TestIdleSlabsReleased(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{SlabSize: slabFor(be), Idle: time.Millisecond})
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
		write(t, c, b2, 0, []byte{1})
		if got := read(t, c, b2, 0, 1); got[0] != 1 {
			t.Fatal("new slab does not hold a write")
		}
	})
}

// TestDaemonDeath: after kill -9 of the daemon a client's next call says
// the daemon is gone, and memory it mapped stays readable.
func TestDaemonDeath(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		cmd, path := childPoolCmd(t, be, testConfig{})
		stdout, _ := cmd.StdoutPipe()
		stdin, _ := cmd.StdinPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer stdin.Close()
		if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("daemon: %q %v", line, err)
		}
		c := dial(t, path)
		want := randBytes(5000)
		b, err := c.Alloc("w", 5000)
		if err != nil {
			t.Fatal(err)
		}
		write(t, c, b, 0, want)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		_, err = c.Alloc("", 10)
		if !errors.Is(err, pool.ErrClosed) || !strings.Contains(err.Error(), "is gone") {
			t.Fatalf("call after the daemon died: %v", err)
		}
		if _, err := c.Stats(); !errors.Is(err, pool.ErrClosed) {
			t.Fatalf("second call: %v", err)
		}
		if !bytes.Equal(read(t, c, b, 0, 5000), want) {
			t.Fatal("mapped memory changed after the daemon died")
		}
		write(t, c, b, 0, want[:10])
	})
}

func TestAllowUID(t *testing.T) {
	uid := uint32(os.Getuid())
	path, _ := startPool(t, backends[0], testConfig{AllowUID: []uint32{uid + 1}, RefuseSelf: true})
	_, err := pool.Dial(path)
	if !errors.Is(err, pool.ErrPermission) || !strings.HasSuffix(err.Error(), "ipc: permission denied") {
		t.Fatalf("dial by a uid not allowed: %v", err)
	}
	// The daemon's own uid is always let in (issue 11, item 5: with
	// --group alone the daemon's user was refused).
	path1, _ := startPool(t, backends[0], testConfig{AllowUID: []uint32{uid + 1}, AllowGID: []uint32{4242}})
	if _, err := dial(t, path1).Alloc("", 10); err != nil {
		t.Fatalf("the daemon's own uid: %v", err)
	}
	path2, _ := startPool(t, backends[0], testConfig{AllowUID: []uint32{uid}})
	c := dial(t, path2)
	if _, err := c.Alloc("", 10); err != nil {
		t.Fatalf("allowed uid: %v", err)
	}
	// Admission by group: the primary gid counts.
	path3, _ := startPool(t, backends[0], testConfig{AllowUID: []uint32{}, AllowGID: []uint32{uint32(os.Getgid())}})
	dial(t, path3)
}
