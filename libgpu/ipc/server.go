package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Handler makes one Session per accepted connection.
type Handler interface {
	// Connect is called when a connection is accepted. A non-nil error
	// (ErrPermission for a refused peer) is sent as the reply to the
	// connection's first request, and the connection is closed.
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

// Server accepts connections and runs each in its own goroutine.
type Server struct {
	Handler Handler
	// Logf, if set, receives one line per connection-level problem.
	Logf func(format string, args ...any)

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
// Shutdown.
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
			return fmt.Errorf("ipc: accept: %w", err)
		}
		c := NewConn(uc)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.sessions.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
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

func (s *Server) serveConn(c *Conn) {
	defer s.sessions.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sess, cerr := s.Handler.Connect(c)
	if sess != nil {
		defer sess.Close()
	}
	s.mu.Lock()
	ctx := s.ctx
	s.mu.Unlock()
	var last time.Time // when the previous request came
	for {
		// A connection whose last request came within spinActive is
		// likely to send its next one at once: spin for it (spin.go).
		m, fds, err := c.recv(!last.IsZero() && time.Since(last) < spinActive)
		last = time.Now()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			// Malformed, oversized, wrong version: answer, then close.
			reply := &Message{Version: Version, Type: TypeReply, Op: "error", Err: ToWire(err)}
			if m != nil {
				reply.ID, reply.Flow = m.ID, m.Flow
				if m.Op != "" {
					reply.Op = m.Op
				}
			}
			s.logf("ipc: closing connection: %v", err)
			c.Send(reply)
			return
		}
		if m.Type != TypeRequest {
			closeFDs(fds)
			s.logf("ipc: closing connection: reply %d sent to the server", m.ID)
			c.Send(&Message{Version: Version, Type: TypeReply, ID: m.ID, Op: m.Op, Flow: m.Flow,
				Err: ToWire(fmt.Errorf("%w: a reply sent to the server", ErrMalformed))})
			return
		}
		reply := &Message{Version: Version, Type: TypeReply, ID: m.ID, Op: m.Op, Flow: m.Flow}
		if cerr != nil || sess == nil {
			closeFDs(fds)
			if cerr == nil {
				cerr = ErrInternal
			}
			reply.Err = ToWire(cerr)
			c.Send(reply)
			return
		}
		body, out, herr := s.handle(sess, ctx, m, fds)
		closeFDs(fds)
		if m.NoReply {
			closeFDs(out)
			if herr != nil {
				s.logf("ipc: %s (no reply wanted): %v", m.Op, herr)
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
			s.logf("ipc: send reply to %s: %v", m.Op, err)
			return
		}
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
