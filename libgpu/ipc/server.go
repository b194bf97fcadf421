package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Handler makes one Session per accepted connection.
type Handler interface {
	// Connect is called when a connection is accepted. A non-nil error
	// (ErrPermission for a refused peer) is sent at once as a reply with
	// id 0, and the connection is closed without reading from it.
	Connect(c *Conn) (Session, error)
}

// Session serves the requests of one connection, one at a time, in order.
type Session interface {
	// Handle runs one request. fds came with it and are closed by the
	// server when Handle returns (dup what must be kept). The reply carries
	// body (msgpack-encoded; nil for none) and outFDs, which the server closes
	// after sending. An unknown op should return an error wrapping
	// ErrUnknownOp; the connection stays open after an error.
	Handle(ctx context.Context, req *Message, fds []int) (body any, outFDs []int, err error)
	// Close is called once when the connection has ended.
	Close()
}

// DefaultMaxConns is the default of Server.MaxConns.
const DefaultMaxConns = 1024

// MaxOp is the longest op a reply repeats, in bytes: a reply to a request
// with a longer op carries its first MaxOp bytes (ops are short names; a
// hostile one must not make the reply too large to send).
const MaxOp = 64

// echoOp is op as a reply repeats it: valid UTF-8 (Decode refuses any
// other op; this is the second line of defence, since a strict peer
// cannot read a reply that is not) and at most MaxOp bytes.
func echoOp(op string) string {
	if len(op) <= MaxOp && utf8.ValidString(op) {
		return op
	}
	return Cut(strings.ToValidUTF8(op, "\uFFFD"), MaxOp)
}

// Server accepts connections and runs each in its own goroutine.
//
// It never stops on a peer's behaviour or a lack of resources: a failed
// accept (out of file descriptors, say) is retried after a pause that
// doubles from 5 ms to 1 s, as net/http does, and when the process is out
// of file descriptors the connection waiting longest is accepted with a
// descriptor kept in reserve for that, told why, and closed.
type Server struct {
	Handler Handler
	// Logf, if set, receives one line per connection-level problem.
	Logf func(format string, args ...any)
	// MaxConns bounds the open connections (0: DefaultMaxConns). A
	// connection past it gets a reply with id 0 and an error wrapping
	// ErrLimit, and is closed.
	MaxConns int

	mu       sync.Mutex
	ctx      context.Context // cancelled by Shutdown; handlers get it
	cancel   context.CancelFunc
	conns    map[*Conn]struct{}
	l        net.Listener
	closing  bool
	sessions sync.WaitGroup
}

// init sets up the context handlers get. Called with s.mu held.
func (s *Server) init() {
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
}

// Serve accepts on l until Shutdown, which closes l; it returns nil after
// Shutdown. It returns an error only when l fails for good (it is closed by
// someone else, or is not a listening socket).
func (s *Server) Serve(l *net.UnixListener) error {
	s.mu.Lock()
	s.init()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.l = l
	if s.conns == nil {
		s.conns = map[*Conn]struct{}{}
	}
	s.mu.Unlock()
	reserve := openReserve()
	defer func() {
		if reserve >= 0 {
			unix.Close(reserve)
		}
	}()
	var pause time.Duration // after a failed accept
	for {
		uc, err := l.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSOCK) || errors.Is(err, unix.EBADF) {
				return fmt.Errorf("ipc: accept: %w", err)
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				var shed bool
				if reserve, shed = s.shed(l, reserve); shed {
					// A client was answered: that is progress, and the
					// next one waiting should be answered as soon.
					pause = 0
					continue
				}
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.logf("ipc: accept: %v; retrying in %v", err, pause)
			time.Sleep(pause)
			continue
		}
		pause = 0
		c := NewConn(uc)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		if max := s.maxConns(); len(s.conns) >= max {
			s.mu.Unlock()
			s.refuse(c, fmt.Errorf("%w: %d connections open (the daemon's most)", ErrLimit, max))
			continue
		}
		s.conns[c] = struct{}{}
		s.sessions.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *Server) maxConns() int {
	if s.MaxConns > 0 {
		return s.MaxConns
	}
	return DefaultMaxConns
}

// openReserve returns a file descriptor held for shed (-1 if none could be
// had).
func openReserve() int {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// shed frees the reserve descriptor to accept the connection waiting
// longest, tells it the daemon is out of descriptors and closes it, so
// clients are answered rather than left in the backlog. It returns the new
// reserve and whether a connection was shed.
func (s *Server) shed(l *net.UnixListener, reserve int) (int, bool) {
	if reserve < 0 {
		return openReserve(), false
	}
	unix.Close(reserve)
	uc, err := l.AcceptUnix()
	if err == nil {
		s.refuse(NewConn(uc), fmt.Errorf("%w: the daemon is out of file descriptors", ErrLimit))
	}
	return openReserve(), err == nil
}

// refuse tells a connection why it is not served (a reply with id 0 and op
// "error") and closes it at once, reading nothing from it.
func (s *Server) refuse(c *Conn, why error) {
	s.logf("ipc: refused a connection: %v", why)
	c.Send(&Message{Version: Version, Type: TypeReply, Op: "error", Err: ToWire(why)})
	c.Close()
}

// Shutdown stops accepting, cancels the context of handlers in progress
// (a handler that waits returns early), closes every connection and waits
// until each session's Close has run.
func (s *Server) Shutdown() {
	s.mu.Lock()
	s.init()
	s.closing = true
	s.cancel()
	if s.l != nil {
		s.l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.sessions.Wait()
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

type connKey struct{}

func (s *Server) serveConn(c *Conn) {
	defer s.sessions.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sess, cerr := s.Handler.Connect(c)
	if cerr != nil || sess == nil {
		if sess != nil {
			sess.Close()
		}
		if cerr == nil {
			cerr = ErrInternal
		}
		s.refuse(c, cerr)
		return
	}
	defer sess.Close()
	s.mu.Lock()
	ctx := context.WithValue(s.ctx, connKey{}, c) // for WatchHangup
	s.mu.Unlock()
	var last time.Time // when the previous request came
	for {
		// A connection whose last request came within spinActive is
		// likely to send its next one at once: spin for it (spin.go).
		m, fds, err := c.recv(!last.IsZero() && time.Since(last) < spinActive)
		last = time.Now()
		if err != nil && m != nil && m.Type == TypeRequest && errors.Is(err, ErrTooManyFDs) {
			// The request arrived whole but its fds did not (too many, or
			// no descriptors left here): it fails, the connection goes on.
			s.logf("ipc: %s: %v", echoOp(m.Op), err)
			if !m.NoReply {
				c.Send(&Message{Version: Version, Type: TypeReply, ID: m.ID, Op: echoOp(m.Op), Flow: m.Flow, Err: ToWire(err)})
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			// Malformed, oversized, wrong version: answer, then close.
			reply := &Message{Version: Version, Type: TypeReply, Op: "error", Err: ToWire(err)}
			if m != nil {
				reply.ID, reply.Flow = m.ID, m.Flow
				if m.Op != "" {
					reply.Op = echoOp(m.Op)
				}
			}
			s.logf("ipc: closing connection: %v", err)
			c.Send(reply)
			return
		}
		if m.Type != TypeRequest {
			closeFDs(fds)
			s.logf("ipc: closing connection: reply %d sent to the server", m.ID)
			c.Send(&Message{Version: Version, Type: TypeReply, ID: m.ID, Op: echoOp(m.Op), Flow: m.Flow,
				Err: ToWire(fmt.Errorf("%w: a reply sent to the server", ErrMalformed))})
			return
		}
		reply := &Message{Version: Version, Type: TypeReply, ID: m.ID, Op: echoOp(m.Op), Flow: m.Flow}
		body, out, herr := s.handle(sess, ctx, m, fds)
		closeFDs(fds)
		if m.NoReply {
			closeFDs(out)
			if herr != nil {
				s.logf("ipc: %s (no reply wanted): %v", reply.Op, herr)
			}
			continue
		}
		if herr == nil {
			reply.Body, herr = MarshalBody(body)
		}
		if herr != nil {
			reply.Body = nil
			reply.Err = ToWire(herr)
			closeFDs(out)
			out = nil
		}
		err = c.Send(reply, out...)
		if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTooManyFDs) {
			reply.Body, reply.Err = nil, ToWire(err)
			err = c.Send(reply)
		}
		closeFDs(out)
		if err != nil {
			s.logf("ipc: send reply to %s: %v", reply.Op, err)
			return
		}
	}
}

// WatchHangup returns a context that is also cancelled, with a cause
// wrapping ErrClosed, as soon as the peer of the connection whose request
// ctx belongs to (a Session's Handle gets it) closes its end: a handler
// about to wait calls it, so that a client that dies stops the wait at
// once. Call stop when the wait is over (before Handle returns); only then
// does the server read the connection again. Outside a Server's handler it
// returns ctx and a stop that does nothing.
func WatchHangup(ctx context.Context) (context.Context, func()) {
	c, ok := ctx.Value(connKey{}).(*Conn)
	if !ok {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return ctx, func() { cancel(nil) }
	}
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Readiness of the socket wakes the callback (new data, or the
		// peer's close); it ends the watch only for the close. A pipelined
		// request is left for the server to read.
		rc.Read(func(fd uintptr) bool {
			if stopped.Load() {
				return true
			}
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if n, _ := unix.Poll(p, 0); n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
				cancel(fmt.Errorf("%w: the client hung up", ErrClosed))
				return true
			}
			return false
		})
	}()
	return ctx, func() {
		stopped.Store(true)
		c.uc.SetReadDeadline(time.Now()) // wakes the watcher
		<-done
		c.uc.SetReadDeadline(time.Time{})
		cancel(nil)
	}
}

// handle runs one request, turning a panic in the handler into an internal
// error reply so one bad request cannot take the daemon down.
func (s *Server) handle(sess Session, ctx context.Context, m *Message, fds []int) (body any, out []int, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logf("ipc: %s handler panicked: %v", m.Op, r)
			body, out, err = nil, nil, fmt.Errorf("%w: %s: %v", ErrInternal, m.Op, r)
		}
	}()
	return sess.Handle(ctx, m, fds)
}
