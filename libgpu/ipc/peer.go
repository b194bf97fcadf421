package ipc

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Admission says which peers a daemon serves, by their credentials
// (SO_PEERCRED): gpupool, the optimizer service and the tracer collector
// decide the same way.
//
// With Anyone set every peer is served (gpupool's default: the socket's
// mode decides who can connect). Otherwise a peer is served when its uid
// is Self (the daemon's own effective uid: set it, os.Geteuid()), or root's
// with Root set (the optimizer service's and the collector's default), is
// listed in UIDs, or when its primary group or one of its supplementary
// groups (read from /proc/PID/status) is listed in GIDs.
type Admission struct {
	Anyone bool
	Self   uint32
	Root   bool
	UIDs   []uint32
	GIDs   []uint32
}

// Check returns nil when cred is admitted, else an error wrapping
// ErrPermission that names the peer.
func (a Admission) Check(cred Cred) error {
	if a.admits(cred) {
		return nil
	}
	return fmt.Errorf("%w: uid %d (gid %d, pid %d) is not admitted (see the daemon's --allow-uid and --group)", ErrPermission, cred.UID, cred.GID, cred.PID)
}

func (a Admission) admits(cred Cred) bool {
	if a.Anyone || cred.UID == a.Self || (a.Root && cred.UID == 0) {
		return true
	}
	if slices.Contains(a.UIDs, cred.UID) || slices.Contains(a.GIDs, cred.GID) {
		return true
	}
	if len(a.GIDs) == 0 {
		return false
	}
	for _, g := range SupplementaryGroups(cred.PID) {
		if slices.Contains(a.GIDs, g) {
			return true
		}
	}
	return false
}

// SupplementaryGroups reads the "Groups:" line of /proc/PID/status (nil
// when it cannot be read). A connected peer's pid is live: SO_PEERCRED is
// taken at connect.
func SupplementaryGroups(pid int32) []uint32 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		out := []uint32{}
		for _, f := range strings.Fields(rest) {
			if g, err := strconv.ParseUint(f, 10, 32); err == nil {
				out = append(out, uint32(g))
			}
		}
		return out
	}
	return nil
}

// ConnLimit is the default connection limit of a daemon: DefaultMaxConns,
// or a quarter of the open file limit if that is less (at least 1), so
// that connections cannot take every file descriptor.
func ConnLimit() int {
	return max(1, min(DefaultMaxConns, int(min(FDLimit(), 1<<30))/4))
}

// UnixPeerCred returns the credentials of uc's peer (SO_PEERCRED): for a
// connection a daemon accepted, the client's at connect time; for one a
// client dialed, those of the process that made the listening socket.
func UnixPeerCred(uc *net.UnixConn) (Cred, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("ipc: peer credentials: %w", err)
	}
	var u *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		u, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("ipc: peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("ipc: SO_PEERCRED: %w", gerr)
	}
	return Cred{PID: u.Pid, UID: u.Uid, GID: u.Gid}, nil
}

// HungUp reports whether the peer has closed its end (or the connection
// failed): what it sent before may still be unread. It does not read.
func (c *Conn) HungUp() bool {
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return true
	}
	hung := false
	if err := rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, _ := unix.Poll(p, 0); n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			hung = true
		}
	}); err != nil {
		return true
	}
	return hung
}

// Listener identifies the daemon at the other end of a connection a
// client made: the credentials of the process that made the listening
// socket (SO_PEERCRED) and the address it is bound to (getpeername; an
// abstract name starts with "@"). Two connections to one live daemon's
// socket give the same answer; a socket anyone else made cannot, so a
// daemon handed a connection by a client (the optimizer service is handed
// the client's pool connection) tells with it that the connection reaches
// the daemon it trusts.
func (c *Conn) Listener() (Cred, string, error) {
	cred, err := UnixPeerCred(c.uc)
	if err != nil {
		return Cred{}, "", err
	}
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return Cred{}, "", fmt.Errorf("ipc: peer address: %w", err)
	}
	var sa unix.Sockaddr
	var gerr error
	if err := rc.Control(func(fd uintptr) { sa, gerr = unix.Getpeername(int(fd)) }); err != nil {
		return Cred{}, "", fmt.Errorf("ipc: peer address: %w", err)
	}
	if gerr != nil {
		return Cred{}, "", fmt.Errorf("ipc: getpeername: %w", gerr)
	}
	su, ok := sa.(*unix.SockaddrUnix)
	if !ok || su.Name == "" || su.Name == "@" { // unnamed: "@" is how x/sys spells an empty abstract name
		return Cred{}, "", fmt.Errorf("ipc: the peer is not bound to a Unix socket address (a socketpair?)")
	}
	return cred, su.Name, nil
}

// File returns a duplicate of the connection's socket as an *os.File (to
// send it to another process with SCM_RIGHTS, say); closing it does not
// close c.
func (c *Conn) File() (*os.File, error) {
	f, err := c.uc.File()
	if err != nil {
		return nil, fmt.Errorf("ipc: socket file: %w", err)
	}
	return f, nil
}
