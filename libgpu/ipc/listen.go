package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Listen listens for unixpacket connections on path, the way a daemon
// should: if something answers on path it refuses (ErrSocketInUse); a stale
// socket file left by a dead daemon is removed; a file at path that is not a
// socket is left alone and is an error. The parent directory is made (0750)
// when missing and the socket is chmod 0660, so a group can be let in.
// Closing the listener removes the socket file. A path starting with "@" is
// an abstract socket (no file, no mode).
func Listen(path string) (*net.UnixListener, error) {
	if path == "" {
		return nil, errors.New("ipc: empty socket path")
	}
	abstract := strings.HasPrefix(path, "@")
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
	if !abstract {
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("ipc: socket directory: %w", err)
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
	}
	return l, nil
}
