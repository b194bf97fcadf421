package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

var binDir string

// TestMain builds the gpupool binary once; the scripts run it as a real
// process, daemon and clients alike.
func TestMain(m *testing.M) {
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
		Dir: "testdata/script",
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", binDir+string(os.PathListSeparator)+e.Getenv("PATH"))
			e.Setenv("GPUKIT_POOL_SOCKET", "")
			e.Setenv("XDG_RUNTIME_DIR", e.WorkDir+"/run")
			e.Setenv("UID", strconv.Itoa(os.Getuid()))
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
