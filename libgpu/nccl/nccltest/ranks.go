package nccltest

import (
	"bytes"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/dist/launch"
	"gpukit/libgpu/nccl"
)

// EnvRequireGPUs is the variable that makes NeedGPUs fail instead of
// skip: set it to the number of GPUs of the multi-GPU machine.
const EnvRequireGPUs = "GPUKIT_REQUIRE_GPUS"

// EnvRankMode is the variable that tells a test binary's helper test
// which mode Ranks started it in (empty: not started by Ranks).
const EnvRankMode = "GPUKIT_NCCL_RANK_MODE"

// NeedGPUs skips a test without n GPUs and NCCL, or fails it when
// GPUKIT_REQUIRE_GPUS is at least n (set it on the multi-GPU machine). It
// does not call cudatest.RequireGPU, so multi-GPU tests stay out of the
// GPU bundle's default selection (a machine of one GPU would count their
// skips as failures); run them by name (GPUKIT_TEST_RUN='^TestMultiGPU').
func NeedGPUs(t testing.TB, n int) {
	t.Helper()
	req, _ := strconv.Atoi(os.Getenv(EnvRequireGPUs))
	have, err := cuda.DeviceCount()
	if err == nil && have >= n {
		if _, err = nccl.LibraryVersion(); err == nil {
			return
		}
	}
	if req >= n {
		t.Fatalf("%d GPUs and NCCL required (%s=%d): %d GPUs here (%v)", n, EnvRequireGPUs, req, have, err)
	}
	t.Skipf("needs %d GPUs and NCCL: %d here (%v)", n, have, err)
}

// RankMode is the mode Ranks started this process in ("" when it did
// not): a helper test returns at once when it is empty.
func RankMode() string { return os.Getenv(EnvRankMode) }

// Ranks runs the helper test of this test binary (the test function
// named helper) as the ranks of a job: one launch.Run per node config
// (several stand for several machines; NProc ranks each), every rank this
// binary re-executed with -test.run=^helper$ and EnvRankMode=mode, all
// meeting at one free loopback port. It fails t unless every node exits
// 0 and every rank's helper passes; the ranks' output goes to t's log and
// is returned (for checks of NCCL's own log).
func Ranks(t *testing.T, helper, mode string, nodes []launch.Config) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	want := 0
	for i, cfg := range nodes {
		want += max(cfg.NProc, 1)
		cfg.Command = []string{exe, "-test.run=^" + helper + "$", "-test.v", "-test.count=1"}
		cfg.Env = append(append(os.Environ(), EnvRankMode+"="+mode), cfg.Env...)
		cfg.MasterPort = port
		cfg.Stdout, cfg.Stderr = &out, &out
		cfg.Grace = 10 * time.Second
		cfg.Logf = t.Logf
		wg.Go(func() { errs[i] = launch.Run(ctx, cfg) })
	}
	wg.Wait()
	t.Logf("ranks' output:\n%s", out.String())
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	if got := strings.Count(out.String(), "--- PASS: "+helper); got != want {
		t.Fatalf("%d ranks passed, want %d", got, want)
	}
	return out.String()
}

// FreePort is a loopback port nothing listens on now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// syncBuffer collects the ranks' output from several copying goroutines.
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
