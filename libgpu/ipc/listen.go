package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenOptions say how a daemon's socket and its directory are set up.
type ListenOptions struct {
	// MakeDir creates the socket's directory when it is missing (its
	// parent must exist): mode 0700, or 0750 with its group set to GID
	// when HasGroup. Created reports whether it did.
	MakeDir bool
	// HasGroup gives the socket (mode 0660) and a directory Listen makes
	// the group GID; an existing directory must then have group GID and
	// let the group search it (g+x), or members could not reach the socket.
	HasGroup bool
	GID      uint32
	// Created is set by Listen when it made the directory.
	Created bool
}

// Listen is ListenWith(path, &ListenOptions{MakeDir: true}).
func Listen(path string) (*net.UnixListener, error) {
	return ListenWith(path, &ListenOptions{MakeDir: true})
}

// ListenWith listens for unixpacket connections on path, the way a daemon
// should (the habit of ssh-agent and tailscale's safesocket):
//
//   - the socket's directory must be a directory (not a symbolic link)
//     owned by this process's effective uid and writable by nobody else
//     (no group or other write bit), else the error wraps ErrUnsafeSocket
//     and names the fix: in a directory another user can write, that user
//     could replace the socket or serve in its place;
//   - a missing directory is made (o.MakeDir) with mode 0700, or 0750 and
//     group o.GID (o.HasGroup);
//   - if something answers on path it refuses (ErrSocketInUse); a stale
//     socket file left by a dead daemon is removed; a file at path that is
//     not a socket is left alone and is an error;
//   - the socket is chmod 0660 (and chgrp o.GID with o.HasGroup), so a
//     group can be let in.
//
// Closing the listener removes the socket file. A path starting with "@" is
// an abstract socket: no file, no directory, no mode; anyone may bind such
// a name, so clients rely on the listener's credentials (DialWith).
func ListenWith(path string, o *ListenOptions) (*net.UnixListener, error) {
	if path == "" {
		return nil, errors.New("ipc: empty socket path")
	}
	abstract := strings.HasPrefix(path, "@")
	if !abstract {
		if err := socketDir(filepath.Dir(path), o); err != nil {
			return nil, err
		}
	}
	conn, err := net.DialTimeout(Network, path, time.Second)
	switch {
	case err == nil:
		conn.Close()
		return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
	case abstract:
	case errors.Is(err, unix.ECONNREFUSED):
		fi, serr := os.Lstat(path)
		if serr == nil && fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("ipc: %s exists and is not a socket", path)
		}
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return nil, fmt.Errorf("ipc: remove stale socket: %w", rerr)
		}
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.EPROTOTYPE):
		return nil, fmt.Errorf("%w: %s (another kind of socket)", ErrSocketInUse, path)
	default:
		if _, serr := os.Lstat(path); serr == nil {
			return nil, fmt.Errorf("ipc: probe %s: %w", path, err)
		}
	}
	l, err := net.ListenUnix(Network, &net.UnixAddr{Name: path, Net: Network})
	if err != nil {
		return nil, fmt.Errorf("ipc: listen: %w", err)
	}
	if !abstract {
		if err := os.Chmod(path, 0o660); err != nil {
			l.Close()
			return nil, fmt.Errorf("ipc: chmod socket: %w", err)
		}
		if o.HasGroup {
			if err := os.Chown(path, -1, int(o.GID)); err != nil {
				l.Close()
				return nil, fmt.Errorf("ipc: socket group %d: %w", o.GID, err)
			}
		}
	}
	return l, nil
}

// socketDir checks (or makes) the directory of a daemon's socket.
func socketDir(dir string, o *ListenOptions) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) && o.MakeDir {
		mode := os.FileMode(0o700)
		if o.HasGroup {
			mode = 0o750
		}
		if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("ipc: socket directory: %w", err)
		} else if err == nil {
			o.Created = true
			// Mkdir's mode went through the umask; set it exactly.
			if err := os.Chmod(dir, mode); err != nil {
				return fmt.Errorf("ipc: socket directory: %w", err)
			}
			if o.HasGroup {
				if err := os.Chown(dir, -1, int(o.GID)); err != nil {
					return fmt.Errorf("ipc: socket directory %s: group %d: %w", dir, o.GID, err)
				}
			}
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("ipc: socket directory %s does not exist (make it, mode 0700)", dir)
		}
		return fmt.Errorf("ipc: socket directory: %w", err)
	}
	return CheckSocketDir(dir, fi, o)
}

// CheckSocketDir applies ListenWith's rules to the directory dir, whose
// Lstat is fi.
func CheckSocketDir(dir string, fi os.FileInfo, o *ListenOptions) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link (use the directory itself)", ErrUnsafeSocket, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafeSocket, dir)
	case !ok:
		return fmt.Errorf("%w: %s: no owner information", ErrUnsafeSocket, dir)
	}
	self := uint32(os.Geteuid())
	perm := st.Mode & 0o7777
	if st.Uid != self {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d): another user could replace the socket; remove it or choose another --socket", ErrUnsafeSocket, dir, st.Uid, self)
	}
	if perm&0o022 != 0 {
		return fmt.Errorf("%w: %s has mode %04o: others can write in it and could replace the socket; chmod go-w %s, or choose another --socket", ErrUnsafeSocket, dir, perm, dir)
	}
	if o.HasGroup && (st.Gid != o.GID || perm&0o010 == 0) {
		return fmt.Errorf("%w: %s (group %d, mode %04o) does not let group %d reach the socket: chgrp %d %s && chmod 0750 %s", ErrUnsafeSocket, dir, st.Gid, perm, o.GID, o.GID, dir, dir)
	}
	return nil
}
