// Package ipctest helps tests of gpukit's daemons play a hostile
// environment: a second user (as root, a test runs a child process under
// another uid, Nobody, to check what a daemon lets that uid do; without
// root it checks what it can) and a full disk (a small tmpfs).
package ipctest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
	self, _ := os.Executable()
	if cmd.Path == os.Args[0] || cmd.Path == self {
		cmd.Path = ExeForOthers(t)
		cmd.Args[0] = cmd.Path
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}
}

// SmallTmpfs mounts a tmpfs of size (mount's syntax: "256k") on a
// temporary directory for the test, unmounted at cleanup: a disk that
// fills. It skips the test where it cannot mount (not root, or a
// container without the right); tests pair it with one that limits the
// file's size instead (RLIMIT_FSIZE), which runs everywhere.
func SmallTmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot mount a tmpfs here (%v); the size-limited file test stands for a full disk", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}
