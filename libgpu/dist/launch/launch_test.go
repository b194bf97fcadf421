package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gpukit/libgpu/dist"
)

// syncBuffer collects the ranks' output (several copying goroutines).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// job is a launch of sh ranks in a temporary directory ($DIR), marked
// with a random variable so that every process it leaves can be found.
type job struct {
	dir, mark string
	cfg       Config
}

func newJob(t *testing.T, nproc int, script string) *job {
	t.Helper()
	j := &job{dir: t.TempDir(), mark: fmt.Sprintf("GPUKIT_LAUNCH_MARK=%d-%d", os.Getpid(), rand.Uint64())}
	j.cfg = Config{
		Command: []string{"sh", "-c", script},
		NProc:   nproc,
		Env:     append(os.Environ(), "DIR="+j.dir, j.mark),
		Grace:   10 * time.Second,
		Logf:    t.Logf,
	}
	out := &syncBuffer{}
	j.cfg.Stdout, j.cfg.Stderr = out, out
	t.Cleanup(func() {
		j.killSurvivors(t)
		if t.Failed() {
			t.Logf("the ranks' output:\n%s", out)
		}
	})
	return j
}

// survivors are the live processes (zombies excluded) whose environment
// holds the job's mark.
func (j *job) survivors() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, append([]byte(j.mark), 0)) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// noSurvivors fails the test if the job left a process; wait > 0 polls
// that long for them to go first (processes dying asynchronously).
func (j *job) noSurvivors(t *testing.T, wait time.Duration) {
	t.Helper()
	end := time.Now().Add(wait)
	for {
		s := j.survivors()
		if len(s) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf("processes left behind: %v", s)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killSurvivors ends, one by one, processes this test started and left.
func (j *job) killSurvivors(t *testing.T) {
	for _, pid := range j.survivors() {
		t.Logf("killing left-behind process %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// pids waits for every rank's pid file ($DIR/pid$RANK) and returns them.
func (j *job) pids(t *testing.T, n int) []int {
	t.Helper()
	end := time.Now().Add(time.Minute)
	var out []int
	for r := 0; r < n; {
		b, err := os.ReadFile(filepath.Join(j.dir, fmt.Sprintf("pid%d", r)))
		if err == nil && bytes.HasSuffix(b, []byte("\n")) {
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			out = append(out, pid)
			r++
			continue
		}
		if time.Now().After(end) {
			t.Fatalf("rank %d never wrote its pid", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return out
}

func (j *job) run(t *testing.T) (chan error, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- Run(ctx, j.cfg) }()
	t.Cleanup(cancel)
	return ch, cancel
}

const (
	pidLine = `echo $$ > "$DIR/pid$RANK.tmp" && mv "$DIR/pid$RANK.tmp" "$DIR/pid$RANK"; `
	forever = `sleep 1000 & wait; `
)

// TestRunEnvironment: every rank gets torchrun's variables for its rank,
// one free MASTER_PORT, the NVLink-multicast switches where unset, the
// caller's values where set, and no agent-store flag; dist.Parse reads
// the rank back.
func TestRunEnvironment(t *testing.T) {
	j := newJob(t, 3, `env > "$DIR/env$RANK"`)
	var base []string
	for _, kv := range j.cfg.Env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "LOCAL_RANK", "GPUKIT_RENDEZVOUS_PORT":
			continue
		}
		base = append(base, kv)
	}
	j.cfg.Env = append(base, "NVSHMEM_DISABLE_NVLS=7", "RANK=99", "TORCHELASTIC_USE_AGENT_STORE=True")
	if err := Run(context.Background(), j.cfg); err != nil {
		t.Fatal(err)
	}
	var port string
	for r := range 3 {
		b, err := os.ReadFile(filepath.Join(j.dir, fmt.Sprintf("env%d", r)))
		if err != nil {
			t.Fatal(err)
		}
		vars := map[string][]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = append(vars[k], v)
			}
		}
		want := map[string]string{
			"RANK": fmt.Sprint(r), "LOCAL_RANK": fmt.Sprint(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
			"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
			"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "7",
		}
		for k, v := range want {
			if len(vars[k]) != 1 || vars[k][0] != v {
				t.Errorf("rank %d: %s=%q, want %q once", r, k, vars[k], v)
			}
		}
		if _, ok := vars["TORCHELASTIC_USE_AGENT_STORE"]; ok {
			t.Errorf("rank %d: TORCHELASTIC_USE_AGENT_STORE passed on", r)
		}
		if p := vars["MASTER_PORT"]; len(p) != 1 || p[0] == "0" || (port != "" && p[0] != port) {
			t.Errorf("rank %d: MASTER_PORT=%q (rank 0 had %q)", r, p, port)
		} else {
			port = p[0]
		}
		w, err := dist.Parse(func(k string) (string, bool) {
			v, ok := vars[k]
			if !ok {
				return "", false
			}
			return v[0], true
		})
		if err != nil || w.Rank != r || w.Size != 3 || w.LocalRank != r || w.Source != "torchrun" {
			t.Errorf("rank %d parses as %+v, %v", r, w, err)
		}
	}
}

// TestRankExitEndsJob: a rank that exits 3 ends the job: the others (and
// the processes they started) are stopped, the error names the rank and
// its status, and nothing is left running.
func TestRankExitEndsJob(t *testing.T) {
	j := newJob(t, 3, pidLine+`if [ "$RANK" = 1 ]; then exit 3; fi; `+forever)
	ch, _ := j.run(t)
	err := <-ch
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || re.LocalRank != 1 || re.Code != 3 || re.Signal != 0 || Status(err) != 3 {
		t.Fatalf("Run: %v (%+v)", err, re)
	}
	want := fmt.Sprintf("rank 1 (local rank 1, pid %d) exited with status 3; stopped the 2 other running ranks", re.Pid)
	if err.Error() != want {
		t.Errorf("message %q\nwant    %q", err, want)
	}
	j.noSurvivors(t, 0)
}

// TestRankKilledEndsJob: kill -9 of a rank ends the job likewise.
func TestRankKilledEndsJob(t *testing.T) {
	j := newJob(t, 2, pidLine+forever)
	ch, _ := j.run(t)
	pids := j.pids(t, 2)
	if err := syscall.Kill(pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-ch
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || re.Pid != pids[1] || re.Signal != syscall.SIGKILL || Status(err) != 137 {
		t.Fatalf("Run: %v (%+v)", err, re)
	}
	want := fmt.Sprintf("rank 1 (local rank 1, pid %d) was killed by signal 9 (killed); stopped the other running rank", pids[1])
	if err.Error() != want {
		t.Errorf("message %q\nwant    %q", err, want)
	}
	j.noSurvivors(t, 0)
}

// TestStubbornRankIsKilled: a rank that ignores SIGTERM is killed after
// the grace period.
func TestStubbornRankIsKilled(t *testing.T) {
	j := newJob(t, 2, `trap '' TERM; `+pidLine+`if [ "$RANK" = 1 ]; then exit 4; fi; while :; do sleep 1; done`)
	j.cfg.Grace = 300 * time.Millisecond
	ch, _ := j.run(t)
	err := <-ch
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || re.Code != 4 {
		t.Fatalf("Run: %v", err)
	}
	j.noSurvivors(t, 0)
}

// TestSignalsForwarded: a forwarded SIGTERM reaches every rank; ranks that
// exit 0 on it make a clean job; SIGINT that ranks answer with status 5 is
// a SignalError with a shell's status 130.
func TestSignalsForwarded(t *testing.T) {
	// A test binary started from a shell's background job begins with
	// SIGINT ignored; its ranks (sh) would inherit that, and a shell cannot
	// trap a signal ignored on entry. While this test runs the test
	// process handles SIGINT, so the processes it starts begin with the
	// default disposition.
	intr := make(chan os.Signal, 1)
	signal.Notify(intr, syscall.SIGINT)
	defer signal.Stop(intr)
	for _, c := range []struct {
		sig    syscall.Signal
		name   string
		script string
		status int
	}{
		{syscall.SIGTERM, "TERM", `trap 'echo TERM > "$DIR/got$RANK"; exit 0' TERM; `, 0},
		{syscall.SIGINT, "INT", `trap 'echo INT > "$DIR/got$RANK"; exit 5' INT; `, 130},
	} {
		j := newJob(t, 3, c.script+pidLine+`while :; do sleep 1; done`)
		sigs := make(chan os.Signal, 1)
		j.cfg.Signals = sigs
		ch, _ := j.run(t)
		j.pids(t, 3)
		sigs <- c.sig
		err := <-ch
		if Status(err) != c.status {
			t.Errorf("%v: Run: %v (status %d, want %d)", c.sig, err, Status(err), c.status)
		}
		if c.status != 0 {
			var se *SignalError
			if !errors.As(err, &se) || se.Signal != c.sig || !strings.Contains(err.Error(), "rank 0 exited with status 5") {
				t.Errorf("%v: %v", c.sig, err)
			}
		}
		for r := range 3 {
			if b, err := os.ReadFile(filepath.Join(j.dir, fmt.Sprintf("got%d", r))); err != nil || string(b) != c.name+"\n" {
				t.Errorf("%v: rank %d got %q, %v", c.sig, r, b, err)
			}
		}
		j.noSurvivors(t, 0)
	}
}

// TestCancelStops: a cancelled context stops the job like a SIGTERM.
func TestCancelStops(t *testing.T) {
	j := newJob(t, 2, pidLine+forever)
	ch, cancel := j.run(t)
	j.pids(t, 2)
	cancel()
	err := <-ch
	var se *SignalError
	if !errors.As(err, &se) || se.Signal != syscall.SIGTERM || Status(err) != 143 {
		t.Fatalf("Run after cancel: %v", err)
	}
	j.noSurvivors(t, 0)
}

func TestConfigErrors(t *testing.T) {
	for name, c := range map[string]Config{
		"no ranks":                 {Command: []string{"true"}},
		"node rank past the nodes": {Command: []string{"true"}, NProc: 1, NNodes: 2, NodeRank: 2, MasterAddr: "h", MasterPort: 1},
		"nodes without an address": {Command: []string{"true"}, NProc: 1, NNodes: 2, MasterPort: 1},
		"nodes without a port":     {Command: []string{"true"}, NProc: 1, NNodes: 2, MasterAddr: "h"},
		"port out of range":        {Command: []string{"true"}, NProc: 1, MasterPort: 70000},
		"no command":               {NProc: 1},
	} {
		if err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	err := Run(context.Background(), Config{Command: []string{"gpukit-no-such-command"}, NProc: 2})
	if !errors.Is(err, exec.ErrNotFound) || Status(err) != 1 {
		t.Errorf("missing command: %v", err)
	}
	ws, err := Config{NProc: 2, NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500}.Worlds()
	if err != nil || len(ws) != 2 || ws[1].Rank != 3 || ws[1].LocalRank != 1 || ws[1].Size != 4 || ws[1].Node != 1 || ws[1].Nodes != 2 {
		t.Errorf("Worlds: %+v, %v", ws, err)
	}
}

// launcher starts this test binary as a launcher process (see
// TestHelperLauncher) running script on nproc ranks.
func launcher(t *testing.T, j *job, nproc int) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperLauncher$")
	cmd.Env = append(j.cfg.Env, "GPUKIT_LAUNCH_HELPER=1", "GPUKIT_LAUNCH_SCRIPT="+j.cfg.Command[2], fmt.Sprintf("GPUKIT_LAUNCH_NPROC=%d", nproc))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestLauncherSIGTERM: SIGTERM to a launcher process reaches every rank.
func TestLauncherSIGTERM(t *testing.T) {
	j := newJob(t, 2, `trap 'echo TERM > "$DIR/got$RANK"; exit 0' TERM; `+pidLine+`while :; do sleep 1; done`)
	cmd := launcher(t, j, 2)
	j.pids(t, 2)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("launcher: %v", err)
	}
	for r := range 2 {
		if b, err := os.ReadFile(filepath.Join(j.dir, fmt.Sprintf("got%d", r))); err != nil || string(b) != "TERM\n" {
			t.Errorf("rank %d: %q, %v", r, b, err)
		}
	}
	j.noSurvivors(t, 0)
}

// TestLauncherKilled: ranks die with a launcher killed by SIGKILL (which
// can pass nothing on): PR_SET_PDEATHSIG.
func TestLauncherKilled(t *testing.T) {
	j := newJob(t, 2, pidLine+`exec sleep 1000`)
	cmd := launcher(t, j, 2)
	j.pids(t, 2)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	j.noSurvivors(t, time.Minute)
}

// TestHelperLauncher is a launcher process when GPUKIT_LAUNCH_HELPER=1:
// it runs $GPUKIT_LAUNCH_SCRIPT on $GPUKIT_LAUNCH_NPROC ranks, passes
// SIGINT and SIGTERM on, and exits with Status.
func TestHelperLauncher(t *testing.T) {
	if os.Getenv("GPUKIT_LAUNCH_HELPER") != "1" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv("GPUKIT_LAUNCH_NPROC"))
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	err := Run(context.Background(), Config{Command: []string{"sh", "-c", os.Getenv("GPUKIT_LAUNCH_SCRIPT")},
		NProc: n, Signals: sigs, Grace: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
	}
	os.Exit(Status(err))
}
