package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"gpukit/libgpu/cli/clitest"
	"gpukit/libgpu/pool"
)

var binDir string

// TestMain builds the gpupool binary once; the scripts run it as a real
// process, daemon and clients alike. On the GPU machine (no Go there) the
// bundle's binary in $GPUKIT_BIN is used instead.
func TestMain(m *testing.M) {
	if dir := os.Getenv("GPUKIT_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "gpupool")); err == nil {
			binDir = dir
			os.Exit(m.Run())
		}
	}
	dir, err := os.MkdirTemp("", "gpupool-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "gpupool"), ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build gpupool:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:  "testdata/script",
		Cmds: clitest.Cmds(),
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", binDir+string(os.PathListSeparator)+e.Getenv("PATH"))
			e.Setenv("GPUKIT_POOL_SOCKET", "")
			e.Setenv("XDG_RUNTIME_DIR", e.WorkDir+"/run")
			e.Setenv("UID", strconv.Itoa(os.Getuid()))
			e.Setenv("GID", strconv.Itoa(os.Getgid()))
			return nil
		},
	})
}

// TestServeSIGTERM: serve prints the socket path when ready, and on SIGTERM
// exits 0 and removes the socket. (testscript's kill sends only INT and KILL.)
func TestServeSIGTERM(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.sock")
	cmd := exec.Command(filepath.Join(binDir, "gpupool"), "serve", "--socket", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != path+"\n" {
		t.Fatalf("serve printed %q (%v), want the socket path", line, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket missing once ready: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after SIGTERM: %v", err)
	}
}

// TestSocketActivation: with LISTEN_FDS the daemon serves the socket
// systemd passed as fd 3, prints its path, and leaves the file (systemd's)
// in place when it exits.
func TestSocketActivation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "act.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" serve --backend host --socket /nonexistent/ignored.sock`, filepath.Join(binDir, "gpupool"))
	cmd.ExtraFiles = []*os.File{f}
	out, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != path+"\n" {
		t.Fatalf("serve printed %q (%v; stderr %q), want the passed socket's path", line, err, stderr.String())
	}
	c, err := pool.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc("", 100); err != nil {
		t.Fatal(err)
	}
	c.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v (%s)", err, stderr.String())
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the daemon removed systemd's socket: %v", err)
	}
}

// TestMetrics: --metrics-addr serves the stats as Prometheus text.
func TestMetrics(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	path := filepath.Join(t.TempDir(), "m.sock")
	cmd := exec.Command(filepath.Join(binDir, "gpupool"), "serve", "--backend", "host", "--socket", path, "--metrics-addr", addr)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	c, err := pool.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := 1 + rand.Int64N(100000)
	if _, err := c.Alloc("", n); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"# TYPE gpupool_used_bytes gauge\n",
		fmt.Sprintf("gpupool_used_bytes{backend=\"host\"} %d\n", (n+255)/256*256),
		"gpupool_clients{backend=\"host\"} 1\n",
		"gpupool_allocations{backend=\"host\"} 1\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
}
