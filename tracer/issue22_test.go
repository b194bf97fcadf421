package main

// Issue 22: the collector held to gpupool's bar, through the real tracer
// binary.

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc/ipctest"
	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

// startServe runs tracer serve with args after --socket and --out, waits
// until it prints its socket, and returns it (killed at cleanup) with its
// stderr.
func startServe(t *testing.T, sock, out string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	serve := exec.Command(filepath.Join(binDir, "tracer"), append([]string{"serve", "--socket", sock, "--out", out}, args...)...)
	stdout, _ := serve.StdoutPipe()
	serr := &bytes.Buffer{}
	serve.Stderr = serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serve.Process.Kill(); serve.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != sock {
		t.Fatalf("serve printed %q (%v): %s", line, err, serr.String())
	}
	return serve, serr
}

// validAfterKill waits (the closer works after the collector's death)
// until out is a valid trace, and returns it.
func validAfterKill(t *testing.T, out string) *chrome.Trace {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tr, err := chrome.ReadFile(out)
		if err == nil {
			if _, err := tr.Validate(); err != nil {
				t.Fatal(err)
			}
			return tr
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(out)
			t.Fatalf("%s is not valid 10 s after the kill: %v (%d bytes, ending %q)", out, err, len(b), b[max(0, len(b)-80):])
		}
	}
}

// Item 6: tracer serve killed with SIGKILL while traced processes flood
// it leaves a valid file, every time (10 kills at random moments).
func TestServeKilledUnderLoad(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(rand.Uint64(), 22))
	for k := 0; k < 10; k++ {
		sock, out := filepath.Join(dir, fmt.Sprintf("s%d.sock", k)), filepath.Join(dir, fmt.Sprintf("t%d.json", k))
		serve, _ := startServe(t, sock, out)
		var floods []*exec.Cmd
		for i := 0; i < 3; i++ {
			f := childCmd(t, "flood", trace.EnvSocket+"="+sock, "N=3000")
			if err := f.Start(); err != nil {
				t.Fatal(err)
			}
			floods = append(floods, f)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if fi, err := os.Stat(out); err == nil && fi.Size() > 50000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no events reached the file")
			}
		}
		time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond)
		serve.Process.Signal(syscall.SIGKILL)
		serve.Wait()
		tr := validAfterKill(t, out)
		for _, f := range floods {
			f.Process.Kill()
			f.Wait()
		}
		t.Logf("kill %d: %d events kept", k, len(tr.Events))
	}
}

// Item 6: a full disk. The collector stops writing, says so (naming the
// file, never the temporary name it was made under), keeps serving, and
// at SIGTERM leaves a valid file holding exactly the events its summary
// says it wrote, and exits 1. limit makes the disk full: a small tmpfs
// (root), or a file size limit (RLIMIT_FSIZE, anywhere).
func checkServeDiskFull(t *testing.T, dir string, limit func(pid int)) {
	sock, out := filepath.Join(t.TempDir(), "s.sock"), filepath.Join(dir, "t.json")
	serve, serr := startServe(t, sock, out)
	if limit != nil {
		limit(serve.Process.Pid)
	}
	flood := childCmd(t, "flood", trace.EnvSocket+"="+sock, "N=1500")
	if out, err := flood.CombinedOutput(); err != nil {
		t.Fatalf("traced tool: %v: %s", err, out)
	}
	serve.Process.Signal(syscall.SIGTERM)
	err := serve.Wait()
	said := serr.String()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("serve on a full disk: %v: %s", err, said)
	}
	if strings.Contains(said, ".tmp") || !strings.Contains(said, out) || !strings.Contains(said, "stopped writing") {
		t.Fatalf("serve said: %s", said)
	}
	m := regexp.MustCompile(`wrote (\d+) events .*; (\d+) events lost`).FindStringSubmatch(said)
	if m == nil {
		t.Fatalf("no counts in: %s", said)
	}
	tr, _ := readTrace(t, out)
	if strconv.Itoa(len(tr.Events)) != m[1] || m[1] == "0" || m[2] == "0" {
		t.Fatalf("%d events in the file; serve said: %s", len(tr.Events), said)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left: %v", ents)
	}
	t.Logf("%s", strings.TrimSpace(said))
}

func TestServeDiskFull(t *testing.T) {
	checkServeDiskFull(t, ipctest.SmallTmpfs(t, "512k"), nil)
}

func TestServeFileSizeLimit(t *testing.T) {
	checkServeDiskFull(t, t.TempDir(), func(pid int) {
		if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 400 << 10, Max: 400 << 10}, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// Item 4: a second uid. A collector admits its own uid and root: nobody's
// events are refused (none reaches the file, the summary counts the
// refusal); with --allow-uid nobody's events are taken, under its own pid
// only: a batch of its naming another process is refused.
func TestServeSecondUID(t *testing.T) {
	if !ipctest.Root() {
		t.Skip("not root: no second uid to play")
	}
	dir := t.TempDir()
	for _, allow := range []bool{false, true} {
		sock := fmt.Sprintf("@tracer-2uid-%d-%d-%v", os.Getpid(), rand.Uint32(), allow)
		out := filepath.Join(dir, fmt.Sprintf("t-%v.json", allow))
		var args []string
		if allow {
			args = []string{"--allow-uid", strconv.Itoa(ipctest.Nobody)}
		}
		serve, serr := startServe(t, sock, out, args...)
		cmd := childCmd(t, "impostor", trace.EnvSocket+"="+sock)
		ipctest.AsUser(t, cmd, ipctest.Nobody, ipctest.Nobody)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nobody's client: %v: %s", err, b)
		}
		serve.Process.Signal(syscall.SIGTERM)
		if err := serve.Wait(); err != nil {
			t.Fatalf("serve: %v: %s", err, serr.String())
		}
		tr, _ := readTrace(t, out)
		mine, impostor := 0, 0
		for _, e := range tr.Events {
			if e.Name == "nobody-event" {
				mine++
			}
			if e.Ph == "M" && e.Args["name"] == "impostor" {
				impostor++
			}
		}
		switch {
		case impostor != 0:
			t.Fatalf("allow %v: a batch for another pid renamed it", allow)
		case !allow && (mine != 0 || !strings.Contains(serr.String(), "connections refused")):
			t.Fatalf("not admitted: %d of its events in the file; serve said %s", mine, serr.String())
		case allow && (mine == 0 || !strings.Contains(serr.String(), "for another process")):
			t.Fatalf("admitted: %d of its events in the file; serve said %s", mine, serr.String())
		}
	}
}

// impostor is a child role (TestServeSecondUID): it records events of its
// own and sends, on a connection of its own, a batch that names pid 1.
func impostor() int {
	tr := trace.FromEnv("nobody")
	tr.Instant("test", "nobody-event")
	tr.Close()
	sock := os.Getenv(trace.EnvSocket)
	c, err := net.DialUnix(trace.Network, nil, &net.UnixAddr{Name: sock, Net: trace.Network})
	if err != nil {
		return 0 // refused at once: fine
	}
	defer c.Close()
	b := trace.AppendBatchHeader(nil, 1, 0, 1)
	b = trace.AppendRecord(b, &trace.Record{Kind: trace.KindProcess, Name: "impostor"})
	c.Write(b)
	time.Sleep(50 * time.Millisecond) // read before the close
	return 0
}
