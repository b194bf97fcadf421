package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

// binDir holds the tracer binary (and, for the pipeline test, gpupool and
// trainer) built once by TestMain.
var binDir string

// envRole makes the test binary a traced child process instead of a test run.
const envRole = "TRACER_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(child(role))
	}
	dir, err := os.MkdirTemp("", "tracer-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "tracer"), ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building tracer: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// child plays a traced tool. Roles: "client" sends N requests with flow ids
// from SEED (FlowOut); "server" handles them (FlowIn); "flood" records
// events for a while. Each prints the tracer's Summary on stderr.
func child(role string) int {
	if role == "impostor" {
		return impostor()
	}
	tr := trace.FromEnv("test-" + role)
	n, _ := strconv.Atoi(os.Getenv("N"))
	seed, _ := strconv.ParseUint(os.Getenv("SEED"), 10, 64)
	r := rand.New(rand.NewPCG(seed, 0))
	switch role {
	case "client", "server":
		for i := 0; i < n; i++ {
			flow := r.Uint64() | 1
			sp := tr.Begin("test", role)
			if role == "client" {
				sp.FlowOut(flow)
			} else {
				sp.FlowIn(flow)
			}
			time.Sleep(50 * time.Microsecond)
			sp.End()
		}
	case "flood":
		deadline := time.Now().Add(time.Duration(n) * time.Millisecond)
		for i := 0; time.Now().Before(deadline); i++ {
			sp := tr.Begin("test", "flood")
			sp.Arg(trace.Int("i", int64(i)))
			sp.End()
			if i%100 == 0 {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	tr.Close()
	sum := tr.Summary()
	if sum != "" {
		fmt.Fprintln(os.Stderr, sum)
	}
	fmt.Fprintf(os.Stderr, "%s done\n", role)
	return 0
}

func childCmd(t *testing.T, role string, env ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), append([]string{envRole + "=" + role}, env...)...)
	return cmd
}

func readTrace(t *testing.T, path string) (*chrome.Trace, chrome.Summary) {
	t.Helper()
	tr, err := chrome.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := tr.Validate()
	if err != nil {
		t.Fatal(err)
	}
	return tr, sum
}

// TestRecordLinksProcesses: under tracer record, a client process and a
// server process that share flow ids appear in one file, linked by flows.
func TestRecordLinksProcesses(t *testing.T) {
	out := filepath.Join(t.TempDir(), "trace.json")
	self, _ := os.Executable()
	n := 20 + rand.IntN(30)
	seed := rand.Uint64()
	script := fmt.Sprintf(`%s=client %q & %s=server %q; wait`, envRole, self, envRole, self)
	cmd := exec.Command(filepath.Join(binDir, "tracer"), "record", "--out", out, "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "N="+strconv.Itoa(n), "SEED="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	tr, sum := readTrace(t, out)
	if sum.CrossFlows != n || sum.LinkedProcesses != 2 || sum.Processes != 3 {
		t.Fatalf("%+v; want %d flows between 2 processes (plus tracer's own)", sum, n)
	}
	names := map[string]bool{}
	for _, p := range tr.Processes {
		names[p] = true
	}
	if !names["test-client"] || !names["test-server"] || !names["tracer"] {
		t.Fatalf("processes %v", tr.Processes)
	}
	if !strings.Contains(stderr.String(), "tracer: wrote") {
		t.Fatalf("no summary line: %s", stderr.String())
	}
}

// TestRecordExitStatus: record passes the command's exit status on.
func TestRecordExitStatus(t *testing.T) {
	code := 1 + rand.IntN(100)
	cmd := exec.Command(filepath.Join(binDir, "tracer"), "record", "--out", filepath.Join(t.TempDir(), "t.json"), "--", "sh", "-c", "exit "+strconv.Itoa(code))
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != code {
		t.Fatalf("exit %v, want %d", err, code)
	}
}

// TestCollectorDownToolRuns: a traced tool with no collector runs to the end
// and reports its dropped events.
func TestCollectorDownToolRuns(t *testing.T) {
	n := 10 + rand.IntN(50)
	cmd := childCmd(t, "client", trace.EnvSocket+"="+filepath.Join(t.TempDir(), "none.sock"), "N="+strconv.Itoa(n), "SEED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("trace: %d of %d events dropped", n, n)) || !strings.Contains(string(out), "client done") {
		t.Fatalf("output %q", out)
	}
}

// TestServeSIGTERMMidRun: SIGTERM while a process floods the collector leaves
// a valid file with the events so far; the flooding tool keeps running and
// reports what it dropped after the collector went away.
func TestServeSIGTERMMidRun(t *testing.T) {
	dir := t.TempDir()
	sock, out := filepath.Join(dir, "s.sock"), filepath.Join(dir, "t.json")
	serve := exec.Command(filepath.Join(binDir, "tracer"), "serve", "--socket", sock, "--out", out)
	stdout, _ := serve.StdoutPipe()
	var serr bytes.Buffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != sock {
		t.Fatalf("serve printed %q (%v): %s", line, err, serr.String())
	}
	flood := childCmd(t, "flood", trace.EnvSocket+"="+sock, "N=1500")
	var fout bytes.Buffer
	flood.Stderr = &fout
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until events reach the file, then stop the collector mid-run.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(out); err == nil && fi.Size() > 20000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no events reached the file")
		}
	}
	serve.Process.Signal(syscall.SIGTERM)
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v: %s", err, serr.String())
	}
	tr, _ := readTrace(t, out)
	floods := 0
	for _, e := range tr.Events {
		if e.Name == "flood" {
			floods++
		}
	}
	if floods == 0 {
		t.Fatal("no flood spans in the file")
	}
	if err := flood.Wait(); err != nil {
		t.Fatalf("traced tool failed: %v: %s", err, fout.String())
	}
	if !strings.Contains(fout.String(), "events dropped") || !strings.Contains(fout.String(), "flood done") {
		t.Fatalf("traced tool said %q", fout.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestReportCheck: report --check --json on a recorded file; bad input gives
// one line and a non-zero status.
func TestReportCheck(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "t.json")
	if err := exec.Command(filepath.Join(binDir, "tracer"), "record", "--out", out, "--", "true").Run(); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command(filepath.Join(binDir, "tracer"), "report", "--check", "--json", out).Output()
	if err != nil || !bytes.Contains(res, []byte(`"check":`)) || !bytes.Contains(res, []byte(`"tracer/record"`)) {
		t.Fatalf("%v: %s", err, res)
	}
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"traceEvents":[{"ph":"X"}]}`), 0o644)
	for _, args := range [][]string{
		{"report", filepath.Join(dir, "missing.json")},
		{"report", "--check", filepath.Join(dir, "bad.json")},
		{"record", "--out", out},
		{"record", "--out", out, "--max-size", "lots", "--", "true"},
		{"serve", "--out", out},
	} {
		cmd := exec.Command(filepath.Join(binDir, "tracer"), args...)
		var se bytes.Buffer
		cmd.Stderr = &se
		err := cmd.Run()
		if err == nil || strings.Count(strings.TrimSpace(se.String()), "\n") != 0 || !strings.HasPrefix(se.String(), "tracer: ") {
			t.Errorf("%v: %v, stderr %q", args, err, se.String())
		}
	}
}
