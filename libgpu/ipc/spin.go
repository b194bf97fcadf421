package ipc

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Spinning for a message instead of sleeping on it.
//
// A Recv that finds nothing to read parks its goroutine on Go's netpoller:
// when the message comes, epoll wakes a thread, the scheduler wakes the
// goroutine, and on a machine where the thread had gone idle the kernel has
// to wake that first. Each hop is a few µs, and an alloc round trip pays one
// such wake-up in the daemon (for the request) and one in the client (for
// the reply). A reader that expects a message soon can instead retry a
// non-blocking recvmsg for a short while and catch it with no wake-up at
// all, at the price of a core kept busy meanwhile.
//
// That price is only worth paying where there are cores to spare and the
// message is likely to come, so spinning is bounded three ways:
//
//   - time: at most spinFor per Recv (25 µs: a pool round trip on a GPU
//     machine is about 24 µs with both wake-ups, so a reply or the
//     connection's next request usually lands well inside it), then the
//     goroutine parks as before;
//   - cores: at most GOMAXPROCS/spinCoresPer goroutines of a process spin
//     at once, none at all with fewer than spinCoresPer procs (on a
//     2-core machine the peer needs the core a spinner takes: spinning
//     there, forced, cut alloc_free's p50 by a sixth but made the worst
//     of 8 concurrent clients' p99 2.5 times longer and an in-process
//     round trip 40% slower, BENCHMARKS.md);
//   - success: a connection whose spins missed spinMisses times in a row
//     (the peer is slow or idle) spins again only on every spinProbe-th Recv,
//     to notice when it speeds up.
//
// Between tries the goroutine yields (runtime.Gosched), so other goroutines
// of the process run. Who spins: a Client's Call reading its own reply (a
// reply is due), and the Server reading the next request of a connection
// whose previous request came less than spinActive ago (a client doing
// alloc then free back to back). A client's reader goroutine and the
// server's read of an idle connection never spin.
const (
	spinFor      = 25 * time.Microsecond
	spinCoresPer = 4
	spinMisses   = 4
	spinProbe    = 16
	spinActive   = time.Millisecond
)

// spinners counts the goroutines of this process spinning in recvSpin.
var spinners atomic.Int32

// Spin modes (spinMode): spinAuto follows the policy above; spinNever and
// spinAlways (the cores bound lifted) exist for tests and benchmarks.
const (
	spinAuto = iota
	spinNever
	spinAlways
)

var spinMode atomic.Int32

// spinState is a connection's record of how its spins went; only the
// goroutine holding Conn.rmu touches it.
type spinState struct {
	misses int    // consecutive spins that found nothing
	skips  uint32 // Recvs since the last spin while missing
}

// want reports whether this Recv should spin, and takes a spinner slot if
// so (give it back with spinners.Add(-1)).
func (s *spinState) want() bool {
	mode := spinMode.Load()
	if mode == spinNever {
		return false
	}
	if s.misses >= spinMisses {
		s.skips++
		if s.skips%spinProbe != 0 {
			return false
		}
	}
	max := int32(runtime.GOMAXPROCS(0) / spinCoresPer)
	if mode == spinAlways {
		max = int32(runtime.GOMAXPROCS(0))
	}
	if spinners.Add(1) > max {
		spinners.Add(-1)
		return false
	}
	return true
}

// done records whether the spin caught a message.
func (s *spinState) done(hit bool) {
	spinners.Add(-1)
	if hit {
		s.misses, s.skips = 0, 0
	} else if s.misses < spinMisses {
		s.misses++
	}
}

// recvmsg is one recvmsg(2) on fd into c.buf and c.oob, with no source
// address (the socket is connected), so nothing is allocated. It never
// waits (MSG_DONTWAIT), so it is a raw system call, as sendmsg (conn.go)
// is.
func (c *Conn) recvmsg(fd uintptr) (n, oobn, rflags int, err syscall.Errno) {
	iov := unix.Iovec{Base: &c.buf[0]}
	iov.SetLen(len(c.buf))
	msg := unix.Msghdr{Iov: &iov, Iovlen: 1, Control: &c.oob[0]}
	msg.SetControllen(len(c.oob))
	r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
	if e != 0 {
		return 0, 0, 0, e
	}
	return int(r), int(msg.Controllen), int(msg.Flags), 0
}

// readSpin reads one message into c.buf and c.oob. With spin, a Recv
// that finds nothing spins (non-blocking tries for up to spinFor) if the
// policy above allows; then, or at once, it waits on the netpoller. Called
// with c.rmu held.
func (c *Conn) readSpin(spin bool) (n, oobn, flags int, err error) {
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return 0, 0, 0, err
	}
	spinning := false
	var deadline time.Time
	var errno syscall.Errno
	reset := false
	rerr := rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, errno = c.recvmsg(fd)
			if errno == unix.EINTR {
				continue
			}
			if errno == unix.ECONNRESET && !reset {
				// The peer closed with messages of ours unread: Linux
				// reports that once, before the messages the peer sent
				// (its last word, such as why it refused us). Read those.
				reset = true
				continue
			}
			if errno != unix.EAGAIN {
				if spinning {
					c.spin.done(true)
					spinning = false
				}
				return true
			}
			if spin {
				spin = false // decide once, at the first miss
				if spinning = c.spin.want(); spinning {
					deadline = time.Now().Add(spinFor)
				}
			}
			if !spinning {
				return false // park until epoll says readable
			}
			if time.Now().After(deadline) {
				c.spin.done(false)
				spinning = false
				return false
			}
			runtime.Gosched()
		}
	})
	if rerr != nil {
		if spinning {
			c.spin.done(false)
		}
		return 0, 0, 0, rerr
	}
	if errno != 0 {
		return 0, 0, 0, errno
	}
	return n, oobn, flags, nil
}
