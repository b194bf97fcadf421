package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/trace"
)

// Regression tests of issue 11 ("trust the daemons"), one or more per
// numbered item; the ipc package has the protocol-level ones.

// startNofileChild runs a daemon in a child process under RLIMIT_NOFILE
// nofile (soft and hard) and returns its socket and process.
func startNofileChild(t *testing.T, tc testConfig, nofile int) (string, *os.Process) {
	t.Helper()
	cmd, path := childPoolCmd(t, backends[0], tc)
	cmd.Env = append(cmd.Env, "GPUPOOL_TEST_NOFILE="+strconv.Itoa(nofile))
	stdout, _ := cmd.StdoutPipe()
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child daemon: %q %v", line, err)
	}
	return path, cmd.Process
}

func procFDs(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("daemon gone? %v", err)
	}
	return len(ents)
}

// Item 1: a daemon under a low file descriptor limit, flooded with
// connections and with allocations that each need a slab of their own,
// refuses what it cannot hold with errors naming the limit, never exits,
// and keeps its named buffers.
func TestFDExhaustionChildDaemon(t *testing.T) {
	const nofile = 128
	path, proc := startNofileChild(t, testConfig{SlabSize: 1 << 20}, nofile)
	keeper := dial(t, path)
	want := randBytes(10000)
	kb, err := keeper.AllocKeep("precious", int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	write(t, keeper, kb, 0, want)
	st, err := keeper.Stats()
	if err != nil || st.FDLimit != nofile || st.MaxConns != nofile/4 {
		t.Fatalf("stats %+v %v: want fd_limit %d, max_conns %d", st, err, nofile, nofile/4)
	}

	// A flood of connections: past the limit each is told and closed.
	var flood []*pool.Client
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	limited, dropped := 0, 0
	for i := 0; i < 3*nofile; i++ {
		c, err := pool.Dial(path)
		switch {
		case err == nil:
			flood = append(flood, c)
		case errors.Is(err, ipc.ErrLimit):
			limited++
		case errors.Is(err, pool.ErrUnreachable) && errors.Is(err, ipc.ErrClosed) && unix.Kill(proc.Pid, 0) == nil:
			// Closed before a word was read, with the daemon alive: the
			// kernel or Go's runtime could not set the accepted socket up
			// (once in CI, 2026-11-28). A few are allowed; the daemon's
			// log (printed if this test fails) says what it saw.
			t.Logf("connection %d: %v", i, err)
			if dropped++; dropped > 3 {
				t.Fatalf("%d connections closed without a reason", dropped)
			}
		default:
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if limited == 0 || len(flood) >= nofile/4 {
		t.Fatalf("%d connections served, %d refused for the limit, %d closed", len(flood), limited, dropped)
	}
	// One admitted client asks for buffers larger than a slab until the
	// daemon says no: a limit, not a crash.
	hog := flood[0]
	var big []*pool.Buffer
	for {
		b, err := hog.AllocRequest(pool.AllocRequest{Size: 2 << 20})
		if err != nil {
			if !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "slabs") {
				t.Fatalf("after %d large buffers: %v", len(big), err)
			}
			break
		}
		big = append(big, b)
		if len(big) > nofile {
			t.Fatalf("%d slabs under %d file descriptors", len(big), nofile)
		}
	}
	if n := procFDs(t, proc.Pid); n > nofile {
		t.Fatalf("daemon holds %d fds under a limit of %d", n, nofile)
	}
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	// The daemon still serves, and the named buffer is intact.
	var c *pool.Client
	for {
		if c, err = pool.Dial(path); err == nil {
			break
		}
		if !errors.Is(err, ipc.ErrLimit) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // the daemon is still reading the ends
	}
	defer c.Close()
	b, err := c.Open("precious")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, c, b, 0, int64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("the named buffer changed")
	}
	t.Logf("%d large buffers before the limit, %d connections refused", len(big), limited)
}

// Item 1: peers refused admission are closed at once, so a crowd of them
// holding their connections open costs the daemon nothing.
func TestRefusedPeersHoldNothing(t *testing.T) {
	const nofile = 64
	path, proc := startNofileChild(t, testConfig{AllowUID: []uint32{uint32(os.Getuid()) + 1}, RefuseSelf: true}, nofile)
	var conns []*ipc.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 4*nofile; i++ {
		c, err := ipc.Dial(path)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		// Without sending anything: the refusal comes, then the end.
		m, _, err := c.Recv()
		if err != nil || m.ID != 0 || m.Err == nil || !errors.Is(ipc.FromWire(m.Err), ipc.ErrPermission) {
			t.Fatalf("connection %d: %+v %v", i, m, err)
		}
		if _, _, err := c.Recv(); err == nil {
			t.Fatalf("connection %d left open", i)
		}
	}
	if n := procFDs(t, proc.Pid); n > 32 {
		t.Fatalf("the daemon holds %d fds with %d refused peers connected", n, len(conns))
	}
}

// Item 2: a client killed while its open waits for a seal is released at
// once, not when the wait would have ended.
func TestKillDuringWaitingOpen(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{SlabSize: 4 << 20})
	c := dial(t, path)
	if _, err := c.Create("pending", 100, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	base, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	cmd := childCmd(t, path, "waitopen", "GPUPOOL_TEST_NAME=pending")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "waiting\n" {
		cmd.Process.Kill()
		t.Fatalf("child: %q %v", line, err)
	}
	waitStats(t, c, func(s pool.Stats) bool { return s.Waiting == 1 })
	cmd.Process.Signal(syscall.SIGKILL)
	s := waitStats(t, c, func(s pool.Stats) bool { return s.Clients == base.Clients && s.Waiting == 0 })
	if s.Used != base.Used || s.Allocations != base.Allocations {
		t.Fatalf("after the kill: %+v, before the child: %+v", s, base)
	}
}

// Item 3: a client cannot resize the memfd slab it was given: it is sealed
// before its fd leaves the daemon, so others' buffers in it stay whole.
func TestSlabCannotBeResized(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{SlabSize: 1 << 20})
	a, b := dial(t, path), dial(t, path)
	want := randBytes(4096)
	ab, err := a.Create("a/data", int64(len(want)), pool.CreateOptions{Sealed: true})
	if err != nil {
		t.Fatal(err)
	}
	write(t, a, ab.Buffer, 0, want)
	bb, err := b.Alloc("", 100)
	if err != nil {
		t.Fatal(err)
	}
	sh := bb.Share()
	if sh.Kind != 1 || sh.FD < 0 || sh.SlabSize != 1<<20 {
		t.Fatalf("share %+v", sh)
	}
	seals, err := unix.FcntlInt(uintptr(sh.FD), unix.F_GET_SEALS, 0)
	if err != nil || seals&memfdSeals != memfdSeals {
		t.Fatalf("seals %#x %v", seals, err)
	}
	for name, op := range map[string]func() error{
		"shrink":      func() error { return unix.Ftruncate(sh.FD, 0) },
		"grow":        func() error { return unix.Ftruncate(sh.FD, 2<<20) },
		"fallocate":   func() error { return unix.Fallocate(sh.FD, 0, 1<<20, 4096) },
		"write past":  func() error { _, err := unix.Pwrite(sh.FD, []byte{1}, 1<<20); return err },
		"unseal more": func() error { _, err := unix.FcntlInt(uintptr(sh.FD), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); return err },
	} {
		if err := op(); !errors.Is(err, unix.EPERM) {
			t.Errorf("%s: %v, want EPERM", name, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(sh.FD, &st); err != nil || st.Size != 1<<20 {
		t.Fatalf("slab size %d %v", st.Size, err)
	}
	ob, err := b.Open("a/data")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, b, ob, 0, int64(len(want))); !bytes.Equal(got, want) {
		t.Fatal("buffer changed")
	}
}

// rawCall sends one request on a raw connection and returns the reply and
// its fds.
func rawCall(t *testing.T, c *ipc.Conn, m *ipc.Message) (*ipc.Message, []int) {
	t.Helper()
	if err := c.Send(m); err != nil {
		t.Fatal(err)
	}
	r, fds, err := c.Recv()
	if err != nil {
		t.Fatalf("%s: %v", m.Op, err)
	}
	return r, fds
}

func body(t *testing.T, v any) []byte {
	b, err := ipc.MarshalBody(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Items 6, 7 and 8 against the pool's own server: a 66 KB unknown op is
// answered; an alloc sent with noreply does not count its slab's fd as
// delivered; a negative id is refused with an error reply.
func TestPoolWireEdges(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{SlabSize: 1 << 20})
	c, err := ipc.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	op := strings.Repeat("x", 66<<10)
	r, _ := rawCall(t, c, &ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 1, Op: op})
	if r.ID != 1 || r.Err == nil || r.Err.Code != "unknown_op" {
		t.Fatalf("66 KB op: %+v", r)
	}
	// noreply alloc, then an alloc in the same slab: its fd must come.
	if err := c.Send(&ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 2, Op: pool.OpAlloc,
		Body: body(t, pool.AllocRequest{Size: 100}), NoReply: true}); err != nil {
		t.Fatal(err)
	}
	r, fds := rawCall(t, c, &ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 3, Op: pool.OpAlloc, Body: body(t, pool.AllocRequest{Size: 100})})
	var l pool.Lease
	if err := ipc.UnmarshalBody(r.Body, &l); err != nil || r.ID != 3 {
		t.Fatalf("alloc: %+v %v", r, err)
	}
	ipc.CloseFDs(fds)
	if !l.FD || len(fds) != 1 || l.Offset == 0 {
		t.Fatalf("the lease after a noreply alloc: fd %v, %d fds, offset %d (want the slab's fd, and a second buffer)", l.FD, len(fds), l.Offset)
	}
	// A negative id: an error reply (id 0), then the end.
	frame := []byte{0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x01, 0xa2, 'o', 'p', 0xa5, 's', 't', 'a', 't', 's', 0xa2, 'i', 'd', 0xfb}
	if err := c.SendRaw(frame); err != nil {
		t.Fatal(err)
	}
	r, _, err = c.Recv()
	if err != nil || r.ID != 0 || r.Err == nil || !strings.Contains(r.Err.Message, "negative") {
		t.Fatalf("negative id: %+v %v", r, err)
	}
}

// Item 9: ls lists any number of buffers, long names included, page by
// page; every page fits a frame, and no buffer is listed twice or left out.
func TestLsPages(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	path, p := startPool(t, backends[0], testConfig{SlabSize: 4 << 20})
	c := dial(t, path)
	var names []string
	for i := 0; i < 1500; i++ {
		n := make([]byte, 1+r.IntN(pool.MaxNameLen))
		for j := range n {
			n[j] = "abcdefghijklmnopqrstuvwxyz0123456789-_."[r.IntN(39)]
		}
		n[0] = 'a' + byte(i%26)
		name := fmt.Sprintf("%s/%d", string(n[:min(len(n), pool.MaxNameLen-6)]), i)
		if _, err := c.Create(name, 1+r.Int64N(1000), pool.CreateOptions{Sealed: true, DType: "bf16", Shape: []int64{1, 2, 3, 4, 5, 6, 7, 8}}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	for i := 0; i < 300; i++ {
		if _, err := c.Alloc("", 1+r.Int64N(1000)); err != nil {
			t.Fatal(err)
		}
	}
	bufs, err := c.Ls()
	if err != nil {
		t.Fatal(err)
	}
	if len(bufs) != 1800 {
		t.Fatalf("ls listed %d of 1800 buffers", len(bufs))
	}
	slices.Sort(names)
	for i, n := range names {
		if bufs[i].Name != n {
			t.Fatalf("entry %d: %q, want %q", i, bufs[i].Name, n)
		}
	}
	for i := 1500; i < 1800; i++ {
		a, b := bufs[i-1], bufs[i]
		if b.Name != "" || (a.Name == "" && (a.Slab > b.Slab || a.Slab == b.Slab && a.Offset >= b.Offset)) {
			t.Fatalf("unnamed entries out of order at %d: %+v then %+v", i, a, b)
		}
	}
	// Page by page, each reply fits a frame; Limit bounds a page.
	pages := 0
	var after string
	for {
		reply, _, err := p.ls(pool.LsRequest{After: after})
		if err != nil {
			t.Fatal(err)
		}
		b, err := ipc.Encode(&ipc.Message{Version: ipc.Version, Type: ipc.TypeReply, ID: 1 << 60, Op: pool.OpLs, Body: body(t, reply)})
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(b) > ipc.MaxMessage {
			t.Fatalf("page of %d bytes", len(b))
		}
		pages++
		if reply.Next == "" {
			break
		}
		after = reply.Next
	}
	if pages < 2 {
		t.Fatalf("%d pages for 1800 buffers with long names", pages)
	}
	small, _, err := p.ls(pool.LsRequest{Limit: 7})
	if err != nil || len(small.Buffers) != 7 || small.Next != "n:"+names[6] {
		t.Fatalf("limit 7: %d buffers, next %q, %v", len(small.Buffers), small.Next, err)
	}
	if _, _, err := p.ls(pool.LsRequest{After: "u:zz"}); !errors.Is(err, ipc.ErrBadRequest) {
		t.Fatalf("bad cursor: %v", err)
	}
	t.Logf("%d pages", pages)
}

// Item 14: a kept buffer left unsealed by a creator that went away is an
// orphan, shown by ls and stats and removed after the grace period (at
// once with a negative one); an open waiting on it learns the name is gone.
func TestOrphans(t *testing.T) {
	for _, grace := range []time.Duration{-1, time.Millisecond, time.Hour} {
		t.Run(fmt.Sprint(grace), func(t *testing.T) {
			path, p := startPool(t, backends[0], testConfig{SlabSize: 1 << 20, OrphanGrace: grace})
			watcher, obs := dial(t, path), dial(t, path)
			creator, err := pool.Dial(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := creator.Create("half/written", 1000, pool.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := creator.Create("done", 1000, pool.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			sealed, err := creator.Create("sealed", 10, pool.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := sealed.Seal(); err != nil {
				t.Fatal(err)
			}
			opened := make(chan error, 1)
			go func() {
				_, err := watcher.OpenWait("half/written", time.Hour)
				opened <- err
			}()
			waitStats(t, obs, func(s pool.Stats) bool { return s.Waiting == 1 })
			creator.Close()
			switch grace {
			case time.Hour:
				s := waitStats(t, obs, func(s pool.Stats) bool { return s.Orphans == 2 })
				if s.Named != 3 {
					t.Fatalf("stats %+v", s)
				}
				ls, _ := obs.Ls()
				for _, bi := range ls {
					if bi.Orphan != (bi.Name != "sealed") {
						t.Fatalf("ls: %+v", bi)
					}
				}
				// rm removes an orphan before its time.
				if err := obs.Remove("done"); err != nil {
					t.Fatal(err)
				}
				if s, _ := obs.Stats(); s.Orphans != 1 {
					t.Fatalf("after rm: %+v", s)
				}
				p.mu.Lock()
				for a := range p.allocs {
					if a.orphan {
						p.removeOrphan(a) // as the grace period's end would
					}
				}
				p.mu.Unlock()
			}
			if err := <-opened; !errors.Is(err, pool.ErrNoSuchName) {
				t.Fatalf("open waiting on the orphan: %v", err)
			}
			s := waitStats(t, obs, func(s pool.Stats) bool { return s.Orphans == 0 && s.Named == 1 })
			if s.Allocations != 1 {
				t.Fatalf("after the orphans went: %+v", s)
			}
		})
	}
}

// Per-connection limits: each refusal names its limit and leaves the
// connection usable.
func TestConnLimits(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{SlabSize: 1 << 20, ConnLeases: 5, ConnSlabs: 2, ConnMaps: 3})
	c := dial(t, path)
	for i := 0; i < 2; i++ {
		if _, err := c.AllocRequest(pool.AllocRequest{Size: 2 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.AllocRequest(pool.AllocRequest{Size: 2 << 20}); !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "slabs of its own") {
		t.Fatalf("third large buffer: %v", err)
	}
	b, err := c.Alloc("", 10) // the third slab this connection maps
	if err != nil {
		t.Fatal(err)
	}
	// Another client fills that shared slab, so the next small one needs
	// a fourth slab: past this connection's maps.
	o := dial(t, path)
	if _, err := o.Alloc("", 1<<20-512); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc("", 1000); !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "was sent 3 slabs") {
		t.Fatalf("fourth slab: %v", err)
	}
	if _, err := c.Alloc("", 10); err != nil { // where a slab it has has room
		t.Fatalf("after the refusal: %v", err)
	}
	// Leases: another connection.
	d := dial(t, path)
	var last *pool.Buffer
	for i := 0; i < 5; i++ {
		if last, err = d.AllocRequest(pool.AllocRequest{Size: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Alloc("", 10); !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "5 leases") {
		t.Fatalf("sixth lease: %v", err)
	}
	if _, err := d.Open("nope"); !errors.Is(err, pool.ErrNoSuchName) {
		t.Fatalf("open of a missing name at the limit: %v", err)
	}
	last.Free()
	if _, err := d.Alloc("", 10); err != nil {
		t.Fatalf("after a free: %v", err)
	}
	_ = b
}

// The daemon's slab count is bounded (one fd each), before any allocation
// fails with a lack of descriptors.
func TestMaxSlabs(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{SlabSize: 1 << 20, MaxSlabs: 3})
	c := dial(t, path)
	for i := 0; i < 3; i++ {
		if _, err := c.AllocRequest(pool.AllocRequest{Size: 2 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Alloc("", 10); !errors.Is(err, ipc.ErrLimit) || !strings.Contains(err.Error(), "3 slabs") {
		t.Fatalf("fourth slab: %v", err)
	}
}

// Item 10, the other way round: a traced tool given the pool's socket as
// its collector runs on, and its summary says the socket is not a tracer's.
func TestTraceClientOnPoolSocket(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{})
	tr := trace.Open(path, "misdirected", trace.Options{FlushEvery: time.Millisecond})
	for i := 0; i < 100; i++ {
		tr.Instant("c", "x")
		time.Sleep(100 * time.Microsecond)
	}
	tr.Close()
	st := tr.Stats()
	if st.Dropped == 0 || st.LastErr == nil || !strings.Contains(st.LastErr.Error(), "not a tracer collector's socket") || !strings.Contains(st.LastErr.Error(), "gpupool") {
		t.Fatalf("stats %+v", st)
	}
}
