package server

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/pool"

	"gpukit/libgpu/ipc/ipctest"
)

// canary is the content written at [0, n) of the buffer with id: a
// function of both, so a byte written through another allocation shows.
func canary(id uint64, n int) []byte {
	b := make([]byte, n)
	var x uint64 = id*0x9E3779B97F4A7C15 + 1
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
	return b
}

const canaryLen = 4096

type live struct {
	id    uint64
	name  string
	owner int // index of the client that holds it
	buf   *pool.Buffer
}

// TestChurn: 10,000 random allocations and frees of 1 B to 64 MiB over
// several clients, with clients dying (connections closed, and child
// processes killed with SIGKILL while they hold memory). Every buffer
// carries a canary at both ends, written through its owner and checked
// through another client; at the end nothing leaks and no two live
// allocations ever overlapped.
func TestChurn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		path, _ := startPool(t, be, testConfig{SlabSize: 4 * slabFor(be)})
		r := rand.New(rand.NewPCG(rand.Uint64(), 1))
		const nClients = 4
		clients := make([]*pool.Client, nClients)
		redial := func(i int) {
			c, err := pool.Dial(path)
			if err != nil {
				t.Fatal(err)
			}
			clients[i] = c
		}
		for i := range clients {
			redial(i)
		}
		defer func() {
			for _, c := range clients {
				c.Close()
			}
		}()
		var lives []live
		var nextID uint64
		size := func() int64 {
			switch p := r.IntN(1000); {
			case p < 3: // a few large ones: a slab of their own
				return 1 + r.Int64N(64<<20)
			case p < 100:
				return 1 + r.Int64N(1<<20)
			default:
				return 1 + r.Int64N(16<<10)
			}
		}
		ends := func(n int64) [][2]int64 {
			k := min(n, canaryLen)
			return [][2]int64{{0, k}, {n - k, k}}
		}
		check := func(l live, via int) {
			c := clients[via]
			b := l.buf.Buffer
			if via != l.owner {
				ob, err := c.Open(l.name)
				if err != nil {
					t.Fatalf("open %s through client %d: %v", l.name, via, err)
				}
				defer ob.Free()
				b = ob
			}
			want := canary(l.id, int(l.buf.Size()))
			for _, e := range ends(l.buf.Size()) {
				got := read(t, c, b, e[0], e[1])
				if string(got) != string(want[e[0]:e[0]+e[1]]) {
					t.Fatalf("buffer %d (%d bytes): canary at %d broken, read through client %d", l.id, l.buf.Size(), e[0], via)
				}
			}
		}
		kills := 0
		const ops = 10000
		for op := 0; op < ops; op++ {
			switch p := r.IntN(100); {
			case p < 50 || len(lives) == 0:
				owner := r.IntN(nClients)
				nextID++
				n := size()
				name := fmt.Sprintf("churn/%d", nextID)
				b, err := clients[owner].Create(name, n, pool.CreateOptions{Ephemeral: true, Sealed: true})
				if err != nil {
					t.Fatalf("op %d: alloc %d bytes: %v", op, n, err)
				}
				want := canary(nextID, int(n))
				for _, e := range ends(n) {
					write(t, clients[owner], b.Buffer, e[0], want[e[0]:e[0]+e[1]])
				}
				lives = append(lives, live{nextID, name, owner, b})
			case p < 90:
				i := r.IntN(len(lives))
				l := lives[i]
				check(l, r.IntN(nClients))
				if err := l.buf.Free(); err != nil {
					t.Fatalf("op %d: free: %v", op, err)
				}
				lives = append(lives[:i], lives[i+1:]...)
			case p < 99:
				check(lives[r.IntN(len(lives))], r.IntN(nClients))
			default:
				if kills < 10 {
					// A child process dies holding memory.
					kills++
					cmd := startHolder(t, path, fmt.Sprintf("%d,%d,%d", 1+r.Int64N(5000), 1+r.Int64N(1<<20), 1+r.Int64N(300)))
					cmd.Process.Signal(syscall.SIGKILL)
					cmd.Wait()
				} else {
					// A client's connection ends: its buffers go.
					i := r.IntN(nClients)
					clients[i].Close()
					kept := lives[:0]
					for _, l := range lives {
						if l.owner != i {
							kept = append(kept, l)
						}
					}
					lives = kept
					redial(i)
				}
			}
			if op%1000 == 999 {
				checkNoOverlap(t, clients[0])
			}
		}
		for _, l := range lives {
			check(l, (l.owner+1)%nClients)
		}
		checkNoOverlap(t, clients[0])
		for _, l := range lives {
			if err := l.buf.Free(); err != nil {
				t.Fatal(err)
			}
		}
		s := waitStats(t, clients[0], func(s pool.Stats) bool { return s.Clients == nClients && s.Allocations == 0 })
		if s.Used != 0 || s.Named != 0 || s.Reserved != s.Free {
			t.Fatalf("after churn: %+v", s)
		}
		t.Logf("%d ops, %d child kills, peak %d bytes, %d slabs left", ops, kills, s.Peak, s.Slabs)
	})
}

// TestNobodyRefused: a client running as nobody (uid 65534; as root the
// test switches the child's credentials) reaches the socket but gets
// "permission denied" and nothing else, while an allowed client is served.
// Without root, the refused peer is this uid, which the daemon does not list.
func TestNobodyRefused(t *testing.T) {
	const nobody = 65534
	self := uint32(os.Getuid())
	allow := []uint32{self}
	if self != 0 {
		allow = []uint32{self + 1}
	}
	// An abstract socket: file modes play no part, SO_PEERCRED decides.
	path := fmt.Sprintf("@gpupool-test-%d-%d", os.Getpid(), rand.Uint32())
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{AllowUID: allow, AllowGID: []uint32{4242}})
	if self != 0 {
		p.self = math.MaxUint32 // this uid plays the refused peer
	}
	srv := &ipc.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(); p.Close() })

	run := func(uid, gid uint32, groups ...uint32) (string, error) {
		cmd := childCmd(t, path, "dial")
		if self == 0 {
			cmd.Path = ipctest.ExeForOthers(t)
			cmd.Args[0] = cmd.Path
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out) + stderr.String(), err
	}
	out, err := run(nobody, nobody)
	if err == nil || !strings.HasSuffix(strings.TrimSpace(out), "pool: hello to "+path+": ipc: permission denied") {
		t.Fatalf("nobody: %v: %q", err, out)
	}
	if self == 0 {
		// A member of an allowed group (supplementary) is let in.
		if out, err := run(nobody, nobody, 4242); err != nil || out != "ok\n" {
			t.Fatalf("member of the allowed group: %v: %q", err, out)
		}
		c := dial(t, path)
		if _, err := c.Alloc("", 10); err != nil {
			t.Fatal(err)
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestFDFlood: requests carrying fds they should not (8 per frame, many
// frames) get their answers and the daemon closes every fd; a frame with
// more fds than allowed is refused alone (the connection goes on); another
// client is served throughout and the daemon leaks no fd.
func TestFDFlood(t *testing.T) {
	path, _ := startPool(t, backends[0], testConfig{})
	good := dial(t, path)
	b, err := good.Alloc("g", 100)
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
	memfd, err := unix.MemfdCreate("flood", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	base := openFDs(t)

	uc, err := net.DialUnix(ipc.Network, nil, &net.UnixAddr{Name: path, Net: ipc.Network})
	if err != nil {
		t.Fatal(err)
	}
	fds := make([]int, ipc.MaxFDs)
	for i := range fds {
		fds[i] = memfd
	}
	buf := make([]byte, ipc.MaxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*ipc.MaxFDs))
	for i := 1; i <= 300; i++ {
		m, _ := ipc.Encode(&ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: uint64(i), Op: pool.OpStats})
		if _, _, err := uc.WriteMsgUnix(m, unix.UnixRights(fds...), nil); err != nil {
			t.Fatal(err)
		}
		n, _, _, _, err := uc.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ipc.Decode(buf[:n])
		if err != nil || r.ID != uint64(i) || r.Err != nil {
			t.Fatalf("reply %d: %+v %v", i, r, err)
		}
	}
	// Too many fds in one frame: refused, connection closed.
	many := make([]int, ipc.MaxFDs+5)
	for i := range many {
		many[i] = memfd
	}
	m, _ := ipc.Encode(&ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 999, Op: pool.OpStats})
	if _, _, err := uc.WriteMsgUnix(m, unix.UnixRights(many...), nil); err != nil {
		t.Fatal(err)
	}
	n, _, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ipc.Decode(buf[:n])
	if err != nil || r.ID != 999 || r.Err == nil || !errors.Is(ipc.FromWire(r.Err), ipc.ErrTooManyFDs) {
		t.Fatalf("too many fds: %+v %v", r, err)
	}
	// Only that request failed (its fds never arrived): the connection
	// goes on.
	m, _ = ipc.Encode(&ipc.Message{Version: ipc.Version, Type: ipc.TypeRequest, ID: 1000, Op: pool.OpStats})
	if _, _, err := uc.WriteMsgUnix(m, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n, _, _, _, err = uc.ReadMsgUnix(buf, oob); err != nil {
		t.Fatal(err)
	}
	if r, err := ipc.Decode(buf[:n]); err != nil || r.ID != 1000 || r.Err != nil {
		t.Fatalf("after the refused fds: %+v %v", r, err)
	}
	uc.Close()
	if _, err := good.Alloc("", 10); err != nil {
		t.Fatalf("other client after the flood: %v", err)
	}
	waitStats(t, good, func(s pool.Stats) bool { return s.Clients == 1 })
	if got := openFDs(t); got > base+1 {
		t.Fatalf("%d fds open after the flood, %d before: the daemon kept some", got, base)
	}
}

// TestIsolate: with --isolate two uids never share a slab and one cannot
// open the other's buffers. The second uid is nobody (root only); without
// root the test checks that one uid's allocations share slabs as usual and
// are refused to no one.
func TestIsolate(t *testing.T) {
	self := uint32(os.Getuid())
	path := fmt.Sprintf("@gpupool-iso-%d-%d", os.Getpid(), rand.Uint32())
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	p := New(Config{SlabSize: 1 << 20, Isolate: true})
	srv := &ipc.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(); p.Close() })
	c := dial(t, path)
	mine, err := c.Create("mine", 100, pool.CreateOptions{Sealed: true})
	if err != nil {
		t.Fatal(err)
	}
	if self != 0 {
		if _, err := c.Open("mine"); err != nil {
			t.Fatal(err)
		}
		return
	}
	// nobody allocates (a "hold" child) and tries to open "mine".
	cmd := childCmd(t, path, "hold", "GPUPOOL_TEST_SIZES=100,200")
	cmd.Path = ipctest.ExeForOthers(t)
	cmd.Args[0] = cmd.Path
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("nobody's holder: %q", line)
	}
	ls, _ := c.Ls()
	slabOf := map[string]uint64{}
	for _, b := range ls {
		slabOf[b.Name] = b.Slab
		if b.OwnerUID == 65534 && b.Slab == mine.Lease().Slab {
			t.Fatalf("nobody's buffer is in root's slab %d", b.Slab)
		}
	}
	if _, err := c.Open("held"); !errors.Is(err, pool.ErrPermission) {
		t.Fatalf("root opens nobody's buffer under --isolate: %v", err)
	}
}
