// Package ipctest helps tests of gpukit's daemons play a second user: as
// root, a test runs a child process under another uid (Nobody) to check
// what a daemon lets that uid do; without root it checks what it can.
package ipctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Nobody is the uid (and gid) a test plays another user with.
const Nobody = 65534

// Root reports whether the test runs as root (and so can switch a child's
// credentials).
func Root() bool { return os.Geteuid() == 0 }

// ExeForOthers copies the running test binary where another uid can run
// it (a world-readable temporary directory, removed at cleanup); go test's
// own build directory is private.
func ExeForOthers(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpukit-test-exe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, filepath.Base(os.Args[0]))
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// AsUser makes cmd run as uid and gid with the supplementary groups given
// (the caller must be root), from a copy of its program another uid can
// run when cmd runs the test binary itself.
func AsUser(t testing.TB, cmd *exec.Cmd, uid, gid uint32, groups ...uint32) {
	t.Helper()
	if cmd.Path == os.Args[0] || cmd.Args[0] == os.Args[0] {
		cmd.Path = ExeForOthers(t)
		cmd.Args[0] = cmd.Path
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}
}
