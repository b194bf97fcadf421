package dist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// freePort returns a loopback port nothing listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func world(rank, size, port int) World {
	return World{Rank: rank, Size: size, LocalRank: rank, LocalSize: size, Nodes: 1,
		MasterAddr: "127.0.0.1", MasterPort: port, RendezvousPort: port, Source: "torchrun"}
}

type result struct {
	data []byte
	err  error
}

// share runs ranks (rank, world size and tag each) in goroutines, in a
// random order with random delays, and returns their results by index.
func share(t *testing.T, r *rand.Rand, port int, timeout time.Duration, ranks []World, tags []string) []result {
	t.Helper()
	out := make([]result, len(ranks))
	var wg sync.WaitGroup
	for _, i := range r.Perm(len(ranks)) {
		delay := time.Duration(r.IntN(30)) * time.Millisecond
		wg.Go(func() {
			time.Sleep(delay)
			rv := &Rendezvous{World: ranks[i], Timeout: timeout, Logf: t.Logf}
			out[i].data, out[i].err = rv.Share(context.Background(), tags[i], func() ([]byte, error) {
				return []byte(fmt.Sprintf("id from rank %d", ranks[i].Rank)), nil
			})
		})
	}
	wg.Wait()
	return out
}

func seeded(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 3))
}

// TestRendezvousShares: every rank gets rank 0's bytes, whoever starts
// first (ranks that dial before rank 0 listens retry).
func TestRendezvousShares(t *testing.T) {
	r := seeded(t)
	for _, size := range []int{2, 5} {
		port := freePort(t)
		var ws []World
		var tags []string
		for i := range size {
			ws, tags = append(ws, world(i, size, port)), append(tags, "nccl")
		}
		for i, res := range share(t, r, port, time.Minute, ws, tags) {
			if res.err != nil || string(res.data) != "id from rank 0" {
				t.Fatalf("size %d, rank %d: %q, %v", size, i, res.data, res.err)
			}
		}
	}
}

// TestRendezvousSingle: one rank shares with nobody and opens no socket.
func TestRendezvousSingle(t *testing.T) {
	rv := &Rendezvous{World: Single()}
	got, err := rv.Share(context.Background(), "x", func() ([]byte, error) { return []byte("solo"), nil })
	if err != nil || string(got) != "solo" {
		t.Fatalf("%q, %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := rv.Share(context.Background(), "x", func() ([]byte, error) { return nil, boom }); err != boom {
		t.Fatalf("payload error: %v", err)
	}
}

// TestRendezvousBadPeers: a missing rank, a duplicate rank, a rank with
// another world size or tag end the rendezvous on every rank that got
// there, with an error naming the cause, instead of a hang.
func TestRendezvousBadPeers(t *testing.T) {
	r := seeded(t)
	cases := []struct {
		name  string
		ranks []World
		tags  []string
		want  string // in rank 0's error
		peers string // in the other ranks' errors
	}{
		{"missing rank", []World{world(0, 3, 0), world(1, 3, 0)}, []string{"a", "a"},
			"rank 2 of 3 did not join", "did not join"},
		{"missing ranks", []World{world(0, 4, 0), world(2, 4, 0)}, []string{"a", "a"},
			"ranks 1, 3 of 4 did not join", "did not join"},
		{"duplicate rank", []World{world(0, 3, 0), world(1, 3, 0), world(1, 3, 0)}, []string{"a", "a", "a"},
			"two processes claim rank 1", "two processes claim rank 1"},
		{"world sizes differ", []World{world(0, 2, 0), world(1, 3, 0)}, []string{"a", "a"},
			"rank 1 at 127.0.0.1", "says the world has 3 ranks, rank 0 says 2"},
		{"tags differ", []World{world(0, 2, 0), world(1, 2, 0)}, []string{"nccl", "other"},
			`wants "other", rank 0 shares "nccl"`, `wants "other"`},
	}
	for _, c := range cases {
		port := freePort(t)
		for i := range c.ranks {
			c.ranks[i].MasterPort, c.ranks[i].RendezvousPort = port, port
		}
		timeout := 30 * time.Second // bad peers end the rendezvous when they arrive
		if strings.HasPrefix(c.name, "missing") {
			timeout = 500 * time.Millisecond // the deadline is the cause
		}
		res := share(t, r, port, timeout, c.ranks, c.tags)
		for i, x := range res {
			want := c.peers
			if c.ranks[i].Rank == 0 {
				want = c.want
			}
			if !errors.Is(x.err, ErrRendezvous) || !strings.Contains(x.err.Error(), want) {
				t.Errorf("%s: rank %d: %q, %v; want an error saying %q", c.name, c.ranks[i].Rank, x.data, x.err, want)
			}
		}
	}
}

// TestRendezvousStrays: connections that are not gpukit ranks (a port
// scanner, an HTTP client) are dropped, and the ranks still meet.
func TestRendezvousStrays(t *testing.T) {
	port := freePort(t)
	var wg sync.WaitGroup
	var got0 []byte
	var err0 error
	wg.Go(func() {
		rv := &Rendezvous{World: world(0, 2, port), Timeout: time.Minute, Logf: t.Logf}
		got0, err0 = rv.Share(context.Background(), "nccl", func() ([]byte, error) { return []byte("id"), nil })
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var c net.Conn
	for {
		var err error
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close() // connects and goes away at once
	rv := &Rendezvous{World: world(1, 2, port), Timeout: time.Minute}
	got1, err1 := rv.Share(context.Background(), "nccl", nil)
	wg.Wait()
	c.Close()
	if err0 != nil || err1 != nil || string(got0) != "id" || string(got1) != "id" {
		t.Fatalf("rank 0: %q, %v; rank 1: %q, %v", got0, err0, got1, err1)
	}
}

// TestRendezvousNotGpukit: a rank that reaches something else on the port
// says so; one that reaches nothing gives up at the deadline.
func TestRendezvousNotGpukit(t *testing.T) {
	for _, c := range []struct {
		name  string
		serve func(net.Conn)
		want  string
	}{
		{"garbage", func(c net.Conn) { c.Write(bytes.Repeat([]byte{0xff}, 64)) }, "not as a gpukit rendezvous"},
		{"hangs up", func(c net.Conn) { c.Read(make([]byte, 64)) }, "hung up without answering"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				c.serve(conn)
				conn.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		rv := &Rendezvous{World: world(1, 2, port), Timeout: 10 * time.Second}
		_, err = rv.Share(context.Background(), "nccl", nil)
		ln.Close()
		if !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	rv := &Rendezvous{World: world(1, 2, freePort(t)), Timeout: 300 * time.Millisecond}
	_, err := rv.Share(context.Background(), "nccl", nil)
	if !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "could not reach rank 0 at 127.0.0.1:") {
		t.Errorf("nobody listening: %v", err)
	}
}

// TestRendezvousPortTaken: rank 0 says clearly that MASTER_PORT is in use.
func TestRendezvousPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	rv := &Rendezvous{World: world(0, 2, port), Timeout: time.Minute}
	_, err = rv.Share(context.Background(), "nccl", func() ([]byte, error) { return []byte("id"), nil })
	if !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "cannot listen on 127.0.0.1:") {
		t.Fatalf("%v", err)
	}
}

// TestRendezvousProcesses runs three processes (this test binary again)
// that read their ranks from torchrun's variables and meet over loopback.
func TestRendezvousProcesses(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	const n = 3
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for rank := range n {
		cmd := exec.Command(exe, "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), "GPUKIT_DIST_HELPER=rendezvous", fmt.Sprintf("RANK=%d", rank),
			fmt.Sprintf("WORLD_SIZE=%d", n), "MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", port))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	for rank, cmd := range cmds {
		err := cmd.Wait()
		got := outs[rank].String()
		if err != nil || !strings.Contains(got, fmt.Sprintf("rank %d of %d got \"id from pid %d\"", rank, n, cmds[0].Process.Pid)) {
			t.Errorf("rank %d: %v\n%s", rank, err, got)
		}
	}
}

// TestHelperProcess is a rank of TestRendezvousProcesses when
// GPUKIT_DIST_HELPER=rendezvous, and does nothing otherwise.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("GPUKIT_DIST_HELPER") != "rendezvous" {
		return
	}
	w, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	rv := &Rendezvous{World: w, Timeout: time.Minute}
	got, err := rv.Share(context.Background(), "nccl", func() ([]byte, error) {
		return []byte(fmt.Sprintf("id from pid %d", os.Getpid())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("rank %d of %d got %q\n", w.Rank, w.Size, got)
}

// TestRendezvousNoPayload: a rank 0 that cannot make the payload tells
// every rank why, and they fail with its reason.
func TestRendezvousNoPayload(t *testing.T) {
	port := freePort(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for rank := range 3 {
		wg.Go(func() {
			rv := &Rendezvous{World: world(rank, 3, port), Timeout: time.Minute}
			_, errs[rank] = rv.Share(context.Background(), "nccl", func() ([]byte, error) {
				return nil, errors.New("nccl: libnccl.so.2 not found")
			})
		})
	}
	wg.Wait()
	if errs[0] == nil || errs[0].Error() != "nccl: libnccl.so.2 not found" {
		t.Errorf("rank 0: %v", errs[0])
	}
	for _, r := range []int{1, 2} {
		if !errors.Is(errs[r], ErrRendezvous) || !strings.Contains(errs[r].Error(), "rank 0 cannot make the nccl id: nccl: libnccl.so.2 not found") {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
}
