package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"

	"gpukit/libgpu/trace"
)

// traceCategory is the category of the span a client puts on the process's
// trace (trace.Default) around each request: named by the op, from before
// the send to the reply (Call) or to the send (Go).
const traceCategory = "ipc"

type flowKey struct{}

// WithFlow returns ctx carrying a flow id: requests made with it carry that
// id in their Flow field, so a tracer can join the spans of one piece of work
// across processes.
func WithFlow(ctx context.Context, flow uint64) context.Context {
	return context.WithValue(ctx, flowKey{}, flow)
}

// FlowFrom returns the flow id carried by ctx, if any.
func FlowFrom(ctx context.Context) (uint64, bool) {
	f, ok := ctx.Value(flowKey{}).(uint64)
	return f, ok
}

// NewFlow returns a fresh random non-zero flow id.
func NewFlow() uint64 {
	for {
		if f := rand.Uint64(); f != 0 {
			return f
		}
	}
}

type result struct {
	m   *Message
	fds []int
}

// waiter is a request in flight: a caller waiting on ch, or a callback.
type waiter struct {
	ch chan result
	fn func(m *Message, fds []int)
}

// Client sends requests over a Conn and matches replies by ID. It is safe
// for concurrent use; requests from several goroutines are in flight at once.
type Client struct {
	conn    *Conn
	mu      sync.Mutex
	pending map[uint64]waiter
	nextID  uint64
	err     error // why the connection ended; set once
	done    chan struct{}
}

// NewClient starts reading replies from conn. Close the Client, not conn.
func NewClient(conn *Conn) *Client {
	c := &Client{conn: conn, pending: map[uint64]waiter{}, done: make(chan struct{})}
	go c.read()
	return c
}

func (c *Client) read() {
	var end, why error
	for {
		m, fds, err := c.conn.Recv()
		if err != nil {
			if why != nil {
				end = fmt.Errorf("%w: %w", ErrClosed, why)
			} else if errors.Is(err, io.EOF) {
				end = ErrClosed
			} else {
				end = fmt.Errorf("%w: %w", ErrClosed, err)
			}
			break
		}
		if m.Type != TypeReply {
			closeFDs(fds)
			continue
		}
		c.mu.Lock()
		w, ok := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if !ok {
			closeFDs(fds)
			if m.ID == 0 && m.Err != nil {
				// The server's answer to a frame it could not read; it
				// closes the connection next.
				why = FromWire(m.Err)
			}
			continue
		}
		if w.fn != nil {
			w.fn(m, fds)
			continue
		}
		w.ch <- result{m, fds}
	}
	c.mu.Lock()
	c.err = end
	pend := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, w := range pend {
		if w.fn != nil {
			w.fn(nil, nil)
		} else {
			close(w.ch)
		}
	}
	close(c.done)
}

// Call sends op with body req and waits for the reply. A successful reply's
// body is decoded into resp (which may be nil) and its fds are returned,
// owned by the caller. A failed reply comes back as a *RemoteError that
// matches the registered sentinel with errors.Is. fds are sent with the
// request and stay owned by the caller. The flow id comes from ctx
// (WithFlow) or is made fresh.
//
// With tracing on (trace.Default), the call is a span of category "ipc"
// named op on the main track; a fresh flow id is its outgoing flow (the
// daemon's handler span is the incoming end), while a caller that passed
// one with WithFlow marks its own sending span (trace.Span.FlowOut).
func (c *Client) Call(ctx context.Context, op string, req, resp any, fds ...int) ([]int, error) {
	body, err := MarshalBody(req)
	if err != nil {
		return nil, err
	}
	flow, ok := FlowFrom(ctx)
	if !ok {
		flow = NewFlow()
	}
	sp := trace.Default().Begin(traceCategory, op)
	if !ok {
		sp.FlowOut(flow)
	}
	defer sp.End()
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = waiter{ch: ch}
	c.mu.Unlock()

	m := &Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Flow: flow, Body: body}
	if err := c.conn.Send(m, fds...); err != nil {
		c.forget(id)
		return nil, fmt.Errorf("ipc: %s: %w", op, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return nil, fmt.Errorf("ipc: %s: %w", op, err)
		}
		if r.m.Err != nil {
			closeFDs(r.fds)
			return nil, FromWire(r.m.Err)
		}
		if err := UnmarshalBody(r.m.Body, resp); err != nil {
			closeFDs(r.fds)
			return nil, fmt.Errorf("ipc: %s reply: %w", op, err)
		}
		return r.fds, nil
	case <-ctx.Done():
		if !c.forget(id) {
			// The reader took the reply already: drop it with its fds.
			if r, ok := <-ch; ok {
				closeFDs(r.fds)
			}
		}
		return nil, ctx.Err()
	}
}

// Go sends op with body req and returns once it is sent, without waiting
// for the reply: fn, if not nil, gets the reply and its fds (which it owns)
// on the connection's reader goroutine, or (nil, nil) if the connection
// ends first; it must not block or call c. With fn nil the reply is
// dropped (its fds closed). Replies to one connection's requests keep their
// order on the server, so a later Call sees the effect of an earlier Go.
// Traced as Call is, the span ending once the request is sent.
func (c *Client) Go(ctx context.Context, op string, req any, fn func(m *Message, fds []int)) error {
	body, err := MarshalBody(req)
	if err != nil {
		return err
	}
	flow, ok := FlowFrom(ctx)
	if !ok {
		flow = NewFlow()
	}
	sp := trace.Default().Begin(traceCategory, op)
	if !ok {
		sp.FlowOut(flow)
	}
	defer sp.End()
	if fn == nil {
		fn = func(_ *Message, fds []int) { closeFDs(fds) }
	}
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = waiter{fn: fn}
	c.mu.Unlock()
	m := &Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Flow: flow, Body: body}
	if err := c.conn.Send(m); err != nil {
		c.forget(id)
		return fmt.Errorf("ipc: %s: %w", op, err)
	}
	return nil
}

// forget drops a pending call; it reports whether the call was still pending.
func (c *Client) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[id]; ok {
		delete(c.pending, id)
		return true
	}
	return false
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (nil while it is up).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection and waits for the reader to stop. Calls in
// flight fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
