package ipc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Network is the net package's name for SOCK_SEQPACKET Unix sockets.
const Network = "unixpacket"

// Conn is one SOCK_SEQPACKET connection: every Send is one message, every
// Recv returns one. Send may be called from several goroutines; Recv from one
// at a time.
type Conn struct {
	uc  *net.UnixConn
	rmu sync.Mutex
	buf []byte
	oob []byte
	// spin is how this connection's spins went (spin.go); under rmu.
	spin spinState
}

// NewConn wraps a connected unixpacket socket.
func NewConn(uc *net.UnixConn) *Conn {
	// Room for one full frame plus slack; best effort (capped by wmem_max).
	uc.SetWriteBuffer(2 * MaxMessage)
	return &Conn{
		uc:  uc,
		buf: make([]byte, MaxMessage+1),
		oob: make([]byte, unix.CmsgSpace(4*MaxFDs)),
	}
}

// DialOptions say whom a client trusts to serve a socket.
type DialOptions struct {
	// TrustUIDs are the uids, besides this process's own and root's, that
	// may own the listening socket (SO_PEERCRED of the listener: the uid
	// that called listen, systemd's for socket activation).
	TrustUIDs []uint32
}

// Dial connects to the unixpacket socket at path, checking that the
// daemon runs as this process's uid or root (see DialWith).
func Dial(path string) (*Conn, error) { return DialWith(path, DialOptions{}) }

// DialWith connects to the unixpacket socket at path and, before anything
// is sent, checks who listens on it: the listener's uid (SO_PEERCRED) must
// be this process's effective uid, root, or in o.TrustUIDs, else the
// connection is closed and the error wraps ErrUntrusted. A socket anyone
// could have bound (an abstract one, or one in a directory another user
// controls) then cannot impersonate the daemon.
func DialWith(path string, o DialOptions) (*Conn, error) {
	uc, err := net.DialUnix(Network, nil, &net.UnixAddr{Name: path, Net: Network})
	if err != nil {
		return nil, err
	}
	c := NewConn(uc)
	cred, err := c.PeerCred()
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := CheckPeer(cred, o.TrustUIDs); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// CheckPeer says whether a daemon with credentials cred may be trusted:
// its uid is this process's effective uid, root, or one of trust.
func CheckPeer(cred Cred, trust []uint32) error {
	if cred.UID == uint32(os.Geteuid()) || cred.UID == 0 || slices.Contains(trust, cred.UID) {
		return nil
	}
	return fmt.Errorf("%w: the daemon runs as uid %d (pid %d), not as uid %d or root", ErrUntrusted, cred.UID, cred.PID, os.Geteuid())
}

// Pair returns two connected Conns (socketpair(AF_UNIX, SOCK_SEQPACKET)).
func Pair() (*Conn, *Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ipc: socketpair: %w", err)
	}
	a, err := FileConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	b, err := FileConn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// FileConn makes a Conn of a connected SOCK_SEQPACKET socket fd, taking
// ownership of fd.
func FileConn(fd int) (*Conn, error) {
	f := fdFile(fd)
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("ipc: fd %d: %w", fd, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok || uc.LocalAddr() == nil || uc.LocalAddr().Network() != Network {
		c.Close()
		return nil, fmt.Errorf("ipc: fd %d is not a connected Unix SOCK_SEQPACKET socket", fd)
	}
	return NewConn(uc), nil
}

// Send encodes m and sends it as one message with fds attached (SCM_RIGHTS).
// The fds stay owned by the caller.
func (c *Conn) Send(m *Message, fds ...int) error {
	bp := sendBufs.Get().(*[]byte)
	b, err := appendEncode((*bp)[:0], m)
	if err == nil {
		err = c.SendRaw(b, fds...)
		*bp = b[:0]
	}
	sendBufs.Put(bp)
	return err
}

// sendBufs holds encode buffers of Send (a frame is at most MaxMessage).
var sendBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// SendRaw sends b as one message, as it is, with fds attached. It exists for
// tests of malformed input and for relays; use Send.
func (c *Conn) SendRaw(b []byte, fds ...int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("%w: %d > %d", ErrTooManyFDs, len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
		if len(b) == 0 {
			// A message of fds alone carries one byte, as the net
			// package sends it: an empty one reads as the end.
			b = []byte{0}
		}
	}
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	var errno syscall.Errno
	werr := rc.Write(func(fd uintptr) bool {
		for {
			if errno = sendmsg(fd, b, oob); errno != unix.EINTR {
				return errno != unix.EAGAIN // full: wait until writable
			}
		}
	})
	switch {
	case werr != nil:
		if errors.Is(werr, net.ErrClosed) {
			return fmt.Errorf("%w: %v", ErrClosed, werr)
		}
		return fmt.Errorf("ipc: send: %w", werr)
	case errno == unix.EPIPE || errno == unix.ECONNRESET:
		return fmt.Errorf("%w: sendmsg: %v", ErrClosed, errno)
	case errno != 0:
		return fmt.Errorf("ipc: send: sendmsg: %w", errno)
	}
	return nil
}

// sendmsg is one non-blocking sendmsg(2) of b and oob on fd, with no
// destination (the socket is connected) and no SIGPIPE. It is a raw system
// call: it never waits for the peer or for room (MSG_DONTWAIT), so it need
// not tell the scheduler (entering and leaving a system call costs about a
// microsecond, and the first one after the process was idle also wakes the
// runtime's sysmon thread with a futex). What it can still take is a copy
// of at most MaxMessage bytes and, under memory pressure, the kernel's
// reclaim of memory for the message, which can stall a page fault in plain
// Go code as much. Measured (BenchmarkServiceStepHost, 2-core host, 4
// interleaved runs each): overhead_idle_p50 32-33 us raw, 39-47 us with
// unix.Syscall in both sendmsg and recvmsg. It allocates nothing.
func sendmsg(fd uintptr, b, oob []byte) syscall.Errno {
	var iov unix.Iovec
	if len(b) > 0 {
		iov.Base = &b[0]
		iov.SetLen(len(b))
	}
	msg := unix.Msghdr{Iov: &iov, Iovlen: 1}
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	_, _, e := unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	return e
}

// Recv reads one message and the fds that came with it; the caller owns
// the fds. At the end of the connection it returns io.EOF (a zero-length
// message reads as the end too). A frame that does not decode gives an error
// wrapping ErrTooLarge, ErrTooManyFDs, ErrMalformed or ErrVersion; its fds
// are closed. With ErrVersion, and with ErrTooManyFDs (the message arrived
// whole, without its fds), the message is returned too, so its ID can be
// answered.
func (c *Conn) Recv() (*Message, []int, error) { return c.recv(false) }

// recv is Recv; with spin, a message that is due soon is waited for by
// spinning rather than sleeping, as far as spin.go's policy allows.
func (c *Conn) recv(spin bool) (*Message, []int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, oobn, flags, err := c.readSpin(spin)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, unix.ECONNRESET) {
			return nil, nil, io.EOF
		}
		return nil, nil, fmt.Errorf("ipc: recv: %w", err)
	}
	if n == 0 && oobn == 0 {
		return nil, nil, io.EOF
	}
	fds, ferr := parseFDs(c.oob[:oobn])
	switch {
	case ferr != nil:
	case flags&unix.MSG_TRUNC != 0 || n > MaxMessage:
		ferr = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, MaxMessage)
	case flags&unix.MSG_CTRUNC != 0:
		// The message itself arrived whole: return it with the error, so
		// a server can answer its id and go on. The kernel drops the fds
		// that do not fit: more than MaxFDs were sent, or this process
		// could not take them (out of file descriptors).
		closeFDs(fds)
		m, err := Decode(c.buf[:n])
		if err != nil {
			return m, nil, err
		}
		return m, nil, fmt.Errorf("%w: more than %d came with %s, or this process is out of file descriptors (limit %d)", ErrTooManyFDs, MaxFDs, Cut(m.Op, MaxOp), FDLimit())
	}
	if ferr != nil {
		closeFDs(fds)
		return nil, nil, ferr
	}
	m, err := Decode(c.buf[:n])
	if err != nil {
		closeFDs(fds)
		return m, nil, err
	}
	return m, fds, nil // Decode copied what it kept of c.buf
}

func parseFDs(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %v", ErrMalformed, err)
	}
	var fds []int
	var bad error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = fmt.Errorf("%w: SCM_RIGHTS: %v", ErrMalformed, err)
			continue
		}
		fds = append(fds, got...)
	}
	if bad != nil {
		closeFDs(fds)
		return nil, bad
	}
	return fds, nil
}

// CloseFDs closes every fd in fds, ignoring errors.
func CloseFDs(fds []int) { closeFDs(fds) }

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Cred is who is on the other end of a connection (SO_PEERCRED: the
// credentials at connect time).
type Cred struct {
	PID int32
	UID uint32
	GID uint32
}

// PeerCred returns the peer's credentials.
func (c *Conn) PeerCred() (Cred, error) { return UnixPeerCred(c.uc) }

// Close closes the connection; a Recv in progress returns io.EOF.
func (c *Conn) Close() error { return c.uc.Close() }

// CloseWrite shuts down the sending side; the peer's Recv returns io.EOF.
func (c *Conn) CloseWrite() error { return c.uc.CloseWrite() }
