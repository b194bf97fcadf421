package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpukit/libgpu/trace"
)

// validTrace reads path and checks it is a valid trace; it returns the
// number of spans named name.
func validTrace(t *testing.T, path, name string) int {
	t.Helper()
	tr, _ := readTrace(t, path)
	n := 0
	for _, e := range tr.Events {
		if e.Name == name {
			n++
		}
	}
	return n
}

// Item 11: a second tracer serve on a live collector's socket is refused
// before it touches any file: the live collector's --out stays a valid
// trace (even with --force), another --out is not made, and the live
// collector goes on collecting into its file.
func TestRefusedSecondCollector(t *testing.T) {
	dir := t.TempDir()
	sock, out := filepath.Join(dir, "s.sock"), filepath.Join(dir, "t.json")
	serve := exec.Command(filepath.Join(binDir, "tracer"), "serve", "--socket", sock, "--out", out)
	stdout, _ := serve.StdoutPipe()
	var serr bytes.Buffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != sock {
		t.Fatalf("serve printed %q (%v): %s", line, err, serr.String())
	}
	traced := func(n int) {
		t.Helper()
		cmd := childCmd(t, "client", trace.EnvSocket+"="+sock, "N="+strconv.Itoa(n), "SEED=7")
		if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "dropped") {
			t.Fatalf("traced child: %v: %s", err, out)
		}
	}
	traced(30)
	for deadline := time.Now().Add(10 * time.Second); validTrace(t, out, "client") < 30; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the events did not reach the file")
		}
	}
	before, _ := os.ReadFile(out)
	for _, args := range [][]string{
		{"serve", "--socket", sock, "--out", out, "--force"},
		{"serve", "--socket", sock, "--out", filepath.Join(dir, "other.json")},
	} {
		cmd := exec.Command(filepath.Join(binDir, "tracer"), args...)
		var se bytes.Buffer
		cmd.Stderr = &se
		if err := cmd.Run(); err == nil || !strings.Contains(se.String(), "in use") {
			t.Fatalf("second collector %v: %v: %s", args, err, se.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "other.json")); !os.IsNotExist(err) {
		t.Fatalf("a refused start made its --out: %v", err)
	}
	if after, _ := os.ReadFile(out); !bytes.HasPrefix(after, before[:len(before)-4]) {
		t.Fatal("the live collector's file changed under the refused start")
	}
	if n := validTrace(t, out, "client"); n < 30 {
		t.Fatalf("%d spans left in the live file", n)
	}
	traced(20)
	serve.Process.Signal(syscall.SIGTERM)
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve: %v: %s", err, serr.String())
	}
	if n := validTrace(t, out, "client"); n != 50 {
		t.Fatalf("%d client spans at the end, want 50", n)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temporary file %s left", e.Name())
		}
	}
}

// A collector replaces an existing --out whole (with --force): a reader of
// the old file keeps reading the old trace.
func TestServeReplacesOutWhole(t *testing.T) {
	dir := t.TempDir()
	sock, out := filepath.Join(dir, "s.sock"), filepath.Join(dir, "t.json")
	old := []byte(`{"traceEvents":[{"name":"old","ph":"i","ts":1,"pid":1,"tid":1,"s":"t"}]}` + "\n")
	os.WriteFile(out, old, 0o644)
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	serve := exec.Command(filepath.Join(binDir, "tracer"), "serve", "--socket", sock, "--out", out, "--force")
	stdout, _ := serve.StdoutPipe()
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(stdout).ReadString('\n')
	serve.Process.Signal(syscall.SIGTERM)
	serve.Wait()
	var still bytes.Buffer
	still.ReadFrom(f)
	if !bytes.Equal(still.Bytes(), old) {
		t.Fatalf("the old file changed: %q", still.String())
	}
	var v map[string]any
	if b, _ := os.ReadFile(out); json.Unmarshal(b, &v) != nil || bytes.Contains(b, []byte(`"old"`)) {
		t.Fatalf("the new file: %s", b)
	}
}

// A traced tool sends nothing to a collector run by another user (one that
// could have taken the socket's name): as root, a collector run by nobody
// on an abstract socket gets no events, and the tool says why.
func TestUntrustedCollector(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: no other user to run the collector")
	}
	dir, err := os.MkdirTemp("", "tracer-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	exe := filepath.Join(dir, "tracer")
	src, _ := os.ReadFile(filepath.Join(binDir, "tracer"))
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := "@tracer-nobody-" + strconv.Itoa(os.Getpid())
	serve := exec.Command(exe, "serve", "--socket", sock, "--out", filepath.Join(dir, "t.json"))
	serve.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdout, _ := serve.StdoutPipe()
	var serr bytes.Buffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != sock {
		t.Fatalf("serve as nobody: %q %v: %s", line, err, serr.String())
	}
	tr := trace.Open(sock, "careful", trace.Options{})
	tr.Instant("c", "secret")
	tr.Close()
	if st := tr.Stats(); st.Sent != 0 || st.LastErr == nil || !strings.Contains(st.LastErr.Error(), "served by uid 65534") {
		t.Fatalf("stats %+v", st)
	}
}
