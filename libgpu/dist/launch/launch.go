package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gpukit/libgpu/dist"
)

// ErrConfig: a Config that cannot describe a job.
var ErrConfig = errors.New("launch: bad configuration")

// DefaultGrace is how long ranks have to exit after SIGTERM before they
// are killed, when Config.Grace is zero (torchrun waits 30 s too).
const DefaultGrace = 30 * time.Second

// Config describes the ranks to start on this machine.
type Config struct {
	// Command is the program and its arguments; a program without a slash
	// is looked up in $PATH.
	Command []string
	// NProc is the number of ranks on this machine (one per GPU).
	NProc int
	// NNodes is the number of machines (0 or 1: this one only); NodeRank
	// is this machine's index in [0, NNodes).
	NNodes, NodeRank int
	// MasterAddr is where rank 0 runs: "127.0.0.1" by default on one
	// machine, required on several.
	MasterAddr string
	// MasterPort is rank 0's rendezvous port. 0 on one machine: a port
	// free on MasterAddr now (picked by listening on port 0 and closing;
	// another program could take it in between, as with torchrun
	// --standalone). Required on several machines.
	MasterPort int
	// Env is the ranks' base environment (nil: os.Environ()); each rank
	// gets dist.World.Env's variables on top, and NCCL_NVLS_ENABLE=0,
	// TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 where
	// Env does not set them (NVLink multicast can take a shared GPU host
	// out of service).
	Env []string
	// Dir is the ranks' working directory ("" : the launcher's).
	Dir string
	// Stdout and Stderr receive every rank's output (nil: the launcher's
	// own, shared with the ranks without copying). Ranks read no stdin.
	Stdout, Stderr io.Writer
	// Signals, when set, delivers the signals to forward to every rank
	// (the caller's signal.Notify channel for SIGINT and SIGTERM). The
	// first is passed on and starts the Grace period; a second kills
	// every rank at once.
	Signals <-chan os.Signal
	// Grace is how long ranks have to exit after a SIGTERM (a failed rank,
	// a forwarded signal, ctx cancelled) before SIGKILL; DefaultGrace
	// when zero.
	Grace time.Duration
	// Logf, when set, receives progress lines (ranks started, stopping).
	Logf func(format string, args ...any)
}

// Exit is how one rank ended.
type Exit struct {
	Rank, LocalRank, Pid int
	Code                 int            // exit status; -1 when a signal killed it
	Signal               syscall.Signal // the signal that killed it, else 0
}

// Failed reports whether the rank exited non-zero or was killed.
func (x Exit) Failed() bool { return x.Code != 0 }

// Status is what a shell would report: the exit status, or 128 + the
// signal's number.
func (x Exit) Status() int {
	if x.Code < 0 {
		return 128 + int(x.Signal)
	}
	return x.Code
}

func (x Exit) how() string {
	if x.Code < 0 {
		return fmt.Sprintf("was killed by signal %d (%v)", int(x.Signal), x.Signal)
	}
	return fmt.Sprintf("exited with status %d", x.Code)
}

// RankError says the job ended because a rank failed: the first rank that
// exited non-zero or was killed, and how many others were still running
// and were stopped.
type RankError struct {
	Exit
	Stopped int
}

func (e *RankError) Error() string {
	s := fmt.Sprintf("rank %d (local rank %d, pid %d) %s", e.Rank, e.LocalRank, e.Pid, e.how())
	switch e.Stopped {
	case 0:
	case 1:
		s += "; stopped the other running rank"
	default:
		s += fmt.Sprintf("; stopped the %d other running ranks", e.Stopped)
	}
	return s
}

// SignalError says the job ended on a forwarded signal (or a cancelled
// context) and at least one rank then exited non-zero.
type SignalError struct {
	Signal os.Signal
	Exits  []Exit
}

func (e *SignalError) Error() string {
	var failed []string
	for _, x := range e.Exits {
		if x.Failed() {
			failed = append(failed, fmt.Sprintf("rank %d %s", x.Rank, x.how()))
		}
	}
	return fmt.Sprintf("stopped by %v: %s", e.Signal, strings.Join(failed, ", "))
}

// Status is what a shell reports for a process the signal ended.
func (e *SignalError) Status() int {
	if s, ok := e.Signal.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// Worlds are the ranks this machine runs, in local-rank order.
func (c Config) Worlds() ([]dist.World, error) {
	nodes := max(c.NNodes, 1)
	switch {
	case c.NProc < 1:
		return nil, fmt.Errorf("%w: --nproc %d (want at least 1)", ErrConfig, c.NProc)
	case c.NNodes < 0 || c.NodeRank < 0 || c.NodeRank >= nodes:
		return nil, fmt.Errorf("%w: --node-rank %d of --nnodes %d", ErrConfig, c.NodeRank, nodes)
	case nodes > 1 && c.MasterAddr == "":
		return nil, fmt.Errorf("%w: --nnodes %d needs --master-addr (rank 0's machine)", ErrConfig, nodes)
	case nodes > 1 && c.MasterPort == 0:
		return nil, fmt.Errorf("%w: --nnodes %d needs --master-port (the same on every machine)", ErrConfig, nodes)
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return nil, fmt.Errorf("%w: --master-port %d (want 0..65535)", ErrConfig, c.MasterPort)
	}
	addr := c.MasterAddr
	if addr == "" {
		addr = "127.0.0.1"
	}
	var ws []dist.World
	for i := range c.NProc {
		ws = append(ws, dist.World{
			Rank: c.NodeRank*c.NProc + i, Size: nodes * c.NProc, LocalRank: i, LocalSize: c.NProc,
			Node: c.NodeRank, Nodes: nodes, MasterAddr: addr, MasterPort: c.MasterPort,
			RendezvousPort: c.MasterPort, Source: "torchrun",
		})
	}
	return ws, nil
}

// safetyEnv is set in every rank unless the environment sets it: NVLink
// multicast off in NCCL, PyTorch and NVSHMEM.
var safetyEnv = []string{"NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"}

// rankEnv is base with w's variables replacing any of the same names, the
// safety variables added where unset, and torchrun's agent-store flag
// dropped (this launcher is the agent, and holds no store).
func rankEnv(base []string, w dist.World) []string {
	set := map[string]bool{}
	own := w.Env()
	for _, kv := range own {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	set["TORCHELASTIC_USE_AGENT_STORE"] = true
	var out []string
	have := map[string]bool{}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if set[k] {
			continue
		}
		have[k] = true
		out = append(out, kv)
	}
	out = append(out, own...)
	for _, kv := range safetyEnv {
		if k, _, _ := strings.Cut(kv, "="); !have[k] {
			out = append(out, kv)
		}
	}
	return out
}

// freePort is a TCP port nothing listens on at addr now.
func freePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type rank struct {
	w   dist.World
	cmd *exec.Cmd
	pid int
}

type exited struct {
	i int
	x Exit
}

// Run starts cfg.NProc ranks of cfg.Command on this machine, each in a
// process group of its own with torchrun's environment (dist.World.Env:
// RANK, LOCAL_RANK, WORLD_SIZE, ..., MASTER_ADDR, MASTER_PORT) and
// PR_SET_PDEATHSIG = SIGKILL (Linux: a rank dies with the launcher, even
// one killed with SIGKILL; the rank's own children are not covered), and
// waits for them.
//
// It returns nil when every rank exits 0. When a rank exits non-zero or is
// killed, the others get SIGTERM (their whole process groups), SIGKILL
// after Grace, and Run returns a *RankError naming the first failed rank
// once every rank has been reaped. A signal from cfg.Signals or a
// cancelled ctx (taken for a SIGTERM) stops the job the same way: the
// signal goes to every rank's process group, SIGKILL follows after Grace
// (at once on a second signal), and Run returns nil if every rank still
// exited 0, else a *SignalError. Config errors wrap ErrConfig;
// a command that cannot be started is reported before any rank starts.
func Run(ctx context.Context, cfg Config) error {
	worlds, err := cfg.Worlds()
	if err != nil {
		return err
	}
	if len(cfg.Command) == 0 {
		return fmt.Errorf("%w: no command", ErrConfig)
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return fmt.Errorf("launch: %s: %w", cfg.Command[0], err)
	}
	if cfg.MasterPort == 0 {
		port, err := freePort(worlds[0].MasterAddr)
		if err != nil {
			return fmt.Errorf("launch: finding a free port on %s: %w", worlds[0].MasterAddr, err)
		}
		for i := range worlds {
			worlds[i].MasterPort, worlds[i].RendezvousPort = port, port
		}
	}
	grace := cfg.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	base := cfg.Env
	if base == nil {
		base = os.Environ()
	}
	stdout, stderr := cfg.Stdout, cfg.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}

	// The ranks are started, and waited for, from one goroutine locked to
	// its OS thread for their whole life: Linux sends PR_SET_PDEATHSIG when
	// the thread that forked a child exits, not the process, and Go ends a
	// thread whose locked goroutine returns without unlocking.
	ranks := make([]*rank, len(worlds))
	exits := make(chan exited, len(worlds))
	started := make(chan error, 1)
	release := make(chan struct{})
	defer close(release)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i, w := range worlds {
			cmd := exec.Command(path, cfg.Command[1:]...)
			cmd.Args[0] = cfg.Command[0]
			cmd.Env = rankEnv(base, w)
			cmd.Dir = cfg.Dir
			cmd.Stdout, cmd.Stderr = stdout, stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			cmd.WaitDelay = time.Second // output pipes a rank's leftover children hold open
			if err := cmd.Start(); err != nil {
				started <- fmt.Errorf("launch: starting rank %d: %w", w.Rank, err)
				<-release
				return
			}
			r := &rank{w: w, cmd: cmd, pid: cmd.Process.Pid}
			ranks[i] = r
			go func() { exits <- exited{i, exitOf(r, cmd.Wait())} }()
		}
		started <- nil
		<-release
	}()
	err = <-started
	running := 0
	for _, r := range ranks {
		if r != nil {
			running++
		}
	}
	if running > 0 {
		logf("launch: started %d ranks of %d (ranks %d..%d, rank 0 at %s:%d)", running, worlds[0].Size,
			worlds[0].Rank, worlds[len(worlds)-1].Rank, worlds[0].MasterAddr, worlds[0].MasterPort)
	}

	var (
		cause    *Exit     // the first failure, when it started the stop
		stopSig  os.Signal // the forwarded signal (SIGTERM for a cancelled ctx), when that started it
		stopping bool
		killAt   <-chan time.Time
		all      []Exit
		stopped  int
	)
	done := make([]bool, len(ranks))
	signalAll := func(sig syscall.Signal) {
		for i, r := range ranks {
			if r != nil && !done[i] {
				syscall.Kill(-r.pid, sig) // the rank's process group: its children too
			}
		}
	}
	stop := func(sig syscall.Signal) {
		stopping = true
		signalAll(sig)
		killAt = time.After(grace)
	}
	if err != nil {
		stop(syscall.SIGTERM)
	}
	sigs, ctxDone := cfg.Signals, ctx.Done()
	for running > 0 {
		select {
		case e := <-exits:
			running--
			done[e.i] = true
			all = append(all, e.x)
			if e.x.Failed() && !stopping {
				x := e.x
				cause, stopped = &x, running
				logf("launch: rank %d (pid %d) %s; stopping the other %d", x.Rank, x.Pid, x.how(), running)
				stop(syscall.SIGTERM)
			}
		case s := <-sigs:
			if stopping {
				logf("launch: %v while stopping: killing every rank", s)
				signalAll(syscall.SIGKILL)
				continue
			}
			stopSig = s
			sig, ok := s.(syscall.Signal)
			if !ok {
				sig = syscall.SIGTERM
			}
			logf("launch: passing %v to %d ranks", s, running)
			stop(sig)
		case <-ctxDone:
			ctxDone = nil
			if !stopping {
				stopSig = syscall.SIGTERM
				stop(syscall.SIGTERM)
			}
		case <-killAt:
			logf("launch: %d ranks still running %v after being stopped: killing them", running, grace)
			signalAll(syscall.SIGKILL)
			killAt = nil
		}
	}
	if stopping {
		// What the stopped ranks left behind in their process groups. (A
		// group whose last member is gone frees its number, which a new
		// group could take in the meantime; that takes a full cycle of
		// process ids within these few milliseconds.)
		var groups []int
		for _, r := range ranks {
			if r != nil {
				syscall.Kill(-r.pid, syscall.SIGKILL)
				groups = append(groups, r.pid)
			}
		}
		if left := waitGroupsGone(groups, 10*time.Second); len(left) > 0 {
			logf("launch: processes %v of the ranks' groups still alive after SIGKILL", left)
		}
	}
	switch {
	case err != nil:
		return err
	case cause != nil:
		return &RankError{Exit: *cause, Stopped: stopped}
	case stopSig != nil:
		for _, x := range all {
			if x.Failed() {
				return &SignalError{Signal: stopSig, Exits: all}
			}
		}
	}
	return nil
}

// exitOf turns cmd.Wait's result into an Exit.
func exitOf(r *rank, _ error) Exit {
	x := Exit{Rank: r.w.Rank, LocalRank: r.w.LocalRank, Pid: r.pid}
	st := r.cmd.ProcessState
	if st == nil {
		x.Code = 1
		return x
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x.Code, x.Signal = -1, ws.Signal()
		return x
	}
	// A rank that exited 0 but whose output pipes its children held open
	// past WaitDelay (err is exec.ErrWaitDelay) did not fail.
	x.Code = st.ExitCode()
	return x
}

// Status is the exit status a launcher process reports for Run's error:
// 0 for nil, the failed rank's (its status, or 128 + signal) for a
// RankError, 128 + signal for a SignalError, else 1.
func Status(err error) int {
	var re *RankError
	var se *SignalError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &re):
		return re.Status()
	case errors.As(err, &se):
		return se.Status()
	}
	return 1
}

// waitGroupsGone waits (at most wait) until no live process (zombies do not
// count) belongs to any of the process groups, so that a stopped job has
// left nothing running when Run returns; it returns what is left.
func waitGroupsGone(groups []int, wait time.Duration) []int {
	in := map[int]bool{}
	for _, g := range groups {
		in[g] = true
	}
	end := time.Now().Add(wait)
	for {
		left := groupMembers(in)
		if len(left) == 0 || time.Now().After(end) {
			return left
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// groupMembers lists the live processes whose process group is in groups,
// from /proc/PID/stat (state: field 3, pgrp: field 5). Without /proc it
// finds none.
func groupMembers(groups map[int]bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pg, err := strconv.Atoi(f[2]); err == nil && groups[pg] {
			out = append(out, pid)
		}
	}
	return out
}
