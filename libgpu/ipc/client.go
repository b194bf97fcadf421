package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

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
	op string
	// long: the caller set its own deadline (a context's): the watchdog
	// leaves it, and the requests queued behind it, alone.
	long bool
}

// lazyRead is how long replies to Go requests may wait unread for a Call
// to read them before the client's own goroutine does.
const lazyRead = time.Millisecond

// Client sends requests over a Conn and matches replies by ID. It is safe
// for concurrent use; requests from several goroutines are in flight at once.
//
// One goroutine at a time reads the connection. A Call (without a
// cancellable context) that finds nobody reading reads its own reply,
// dispatching the replies it meets on the way; a Call that finds a reader
// waits for it to hand its reply over. The client's own goroutine reads
// while replies are awaited and no Call reads: at once for waiting Calls,
// after lazyRead for replies to Go, for ever once Done was asked for.
type Client struct {
	conn    *Conn
	mu      sync.Mutex
	wake    *sync.Cond // the reader goroutine waits on it for work
	pending map[uint64]waiter
	nextID  uint64
	reading bool  // a goroutine holds the right to read conn
	waiting int   // Calls waiting on their channel
	lazy    bool  // replies to Go wait unread
	watch   bool  // Done was asked for: read even when idle
	err     error // why the connection ended; set once
	done    chan struct{}
	why     error       // the server's last word before it closed (ID 0 error)
	timer   *time.Timer // wakes the reader goroutine for lazy replies

	// The watchdog (see SetTimeout): every timeout/2 it notes nextID; a
	// request still pending two notes later has waited at least timeout.
	timeout time.Duration
	dog     *time.Timer
	dogOn   bool
	marks   [2]uint64 // nextID at the last two ticks, older first
	long    int       // pending requests with their own deadline
	expired error     // why the watchdog ended the connection
}

// DefaultTimeout is how long a Client waits for a reply by default (see
// SetTimeout). Pool requests take microseconds; the slowest is making a
// large slab on a GPU.
const DefaultTimeout = 30 * time.Second

// NewClient starts a client on conn. Close the Client, not conn.
func NewClient(conn *Conn) *Client {
	c := &Client{conn: conn, pending: map[uint64]waiter{}, done: make(chan struct{}), timeout: DefaultTimeout}
	c.dog = time.AfterFunc(time.Hour, c.tick)
	c.dog.Stop()
	c.wake = sync.NewCond(&c.mu)
	c.timer = time.AfterFunc(time.Hour, func() {
		c.mu.Lock()
		if c.lazy {
			c.lazy = false
			c.wake.Signal()
		}
		c.mu.Unlock()
	})
	c.timer.Stop()
	go c.read()
	return c
}

// SetTimeout sets how long a request may wait for its reply (0: for
// ever; DefaultTimeout until set). A request that waits longer (between d
// and 1.5 d) ends the connection: every request in flight fails with an
// error wrapping ErrTimeout and ErrClosed, as do later ones (a late reply
// could carry a file descriptor the daemon would then think delivered, so
// the connection cannot go on). A Call whose context has a deadline is
// bounded by that instead, and while it waits so do the requests sent
// after it (the daemon answers one connection's requests in order).
func (c *Client) SetTimeout(d time.Duration) {
	c.mu.Lock()
	c.timeout = d
	c.mu.Unlock()
}

// arm starts the watchdog if requests are pending and it is off. Called
// with c.mu held.
func (c *Client) arm() {
	if c.dogOn || c.timeout <= 0 || c.pending == nil {
		return
	}
	c.dogOn = true
	// The request just registered (the only one pending) counts as made
	// at this tick.
	c.marks = [2]uint64{c.nextID - 1, c.nextID}
	c.dog.Reset(c.timeout / 2)
}

// tick is the watchdog: it ends the connection when a request registered
// before the tick before last (at least timeout ago) is still pending,
// unless a request with its own deadline is pending.
func (c *Client) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 || c.timeout <= 0 {
		c.dogOn = false
		return
	}
	old := c.marks[0]
	c.marks = [2]uint64{c.marks[1], c.nextID}
	if c.long == 0 {
		for id, w := range c.pending {
			if id <= old && !w.long {
				c.expired = fmt.Errorf("%w: no reply to %s within %v", ErrTimeout, w.op, c.timeout)
				c.dogOn = false
				c.conn.Close() // whoever reads sees the end
				c.end(fmt.Errorf("%w: %w", ErrClosed, c.expired))
				return
			}
		}
	}
	c.dog.Reset(c.timeout / 2)
}

// wanted reports whether the reader goroutine should read now. Called
// with c.mu held.
func (c *Client) wanted() bool {
	if c.pending == nil || c.reading {
		return false
	}
	return c.watch || (len(c.pending) > 0 && (c.waiting > 0 || !c.lazy))
}

// read is the client's own reader goroutine.
func (c *Client) read() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for c.pending != nil && !c.wanted() {
			c.wake.Wait()
		}
		if c.pending == nil {
			return
		}
		c.reading = true
		c.mu.Unlock()
		m, fds, err := c.conn.Recv()
		c.mu.Lock()
		c.reading = false
		c.dispatch(m, fds, err, nil)
	}
}

// dispatch hands one received message (or the error that ended the
// connection) to its waiter. mine, if not nil, is the waiter of the
// calling goroutine: its reply is returned instead of sent. Called with
// c.mu held; it may drop it to run callbacks.
func (c *Client) dispatch(m *Message, fds []int, err error, mine chan result) (res result, got bool) {
	if err != nil {
		var end error
		switch {
		case c.expired != nil:
			end = fmt.Errorf("%w: %w", ErrClosed, c.expired)
		case c.why != nil:
			end = fmt.Errorf("%w: %w", ErrClosed, c.why)
		case errors.Is(err, io.EOF):
			end = ErrClosed
		default:
			end = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		c.end(end)
		return result{}, false
	}
	if m.Type != TypeReply {
		closeFDs(fds)
		return result{}, false
	}
	w, ok := c.pending[m.ID]
	if !ok {
		closeFDs(fds)
		if m.ID == 0 && m.Err != nil {
			// The server's answer to a frame it could not read; it
			// closes the connection next.
			c.why = FromWire(m.Err)
		}
		return result{}, false
	}
	delete(c.pending, m.ID)
	if w.long {
		c.longDone()
	}
	if w.fn != nil {
		c.mu.Unlock()
		w.fn(m, fds)
		c.mu.Lock()
		return result{}, false
	}
	if w.ch == mine {
		return result{m, fds}, true
	}
	w.ch <- result{m, fds}
	return result{}, false
}

// end records why the connection ended and fails every request in flight.
// Called with c.mu held, once per client (later calls do nothing).
func (c *Client) end(err error) {
	if c.pending == nil {
		return
	}
	c.err = err
	pend := c.pending
	c.pending = nil
	c.timer.Stop()
	c.dog.Stop()
	c.dogOn = false
	c.wake.Broadcast()
	c.mu.Unlock()
	for _, w := range pend {
		if w.fn != nil {
			w.fn(nil, nil)
		} else {
			close(w.ch)
		}
	}
	close(c.done)
	c.mu.Lock()
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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	body, flow, sp, err := start(ctx, op, req)
	if err != nil {
		return nil, err
	}
	defer sp.End()
	ch := make(chan result, 1)
	_, long := ctx.Deadline()
	id, err := c.register(&waiter{ch: ch, op: op, long: long}, false)
	if err != nil {
		return nil, err
	}

	m := &Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Flow: flow, Body: body}
	if err := c.conn.Send(m, fds...); err != nil {
		c.forget(id)
		return nil, c.sendFailed(op, err)
	}
	r, ok, err := c.await(ctx, id, ch)
	if err != nil {
		return nil, err
	}
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
}

// sendFailed is the error of a request that could not be sent. When the
// peer has closed the connection, what it said before (a refusal's reason,
// sent with id 0) is read first, within a second, so the error says why.
func (c *Client) sendFailed(op string, err error) error {
	if !errors.Is(err, ErrClosed) {
		return fmt.Errorf("ipc: %s: %w", op, err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.why != nil {
		return fmt.Errorf("ipc: %s: %w: %w", op, ErrClosed, c.why)
	}
	return fmt.Errorf("ipc: %s: %w", op, err)
}

// longDone counts down the pending requests with their own deadline; when
// none is left the watchdog's clock restarts for the others. Called with
// c.mu held.
func (c *Client) longDone() {
	if c.long--; c.long == 0 {
		c.marks = [2]uint64{0, 0}
	}
}

// await returns the reply to request id: read by this goroutine when
// nobody else reads and ctx cannot be cancelled (a Recv cannot be
// interrupted), else handed over on ch by the reader. ok is false when the
// connection ended first; err is ctx's error.
func (c *Client) await(ctx context.Context, id uint64, ch chan result) (r result, ok bool, err error) {
	if ctx.Done() == nil {
		c.mu.Lock()
		for !c.reading && c.pending != nil {
			if _, mine := c.pending[id]; !mine {
				break // handed over already
			}
			c.reading = true
			c.mu.Unlock()
			m, fds, rerr := c.conn.recv(true) // a reply is due: may spin
			c.mu.Lock()
			c.reading = false
			if r, got := c.dispatch(m, fds, rerr, ch); got {
				if len(c.pending) == 0 && c.lazy {
					c.lazy = false
					c.timer.Stop()
				}
				if c.wanted() {
					c.wake.Signal()
				}
				c.mu.Unlock()
				return r, true, nil
			}
		}
		// Somebody else reads: wait for them.
		c.waiting++
		if c.wanted() {
			c.wake.Signal()
		}
		c.mu.Unlock()
		r, ok = <-ch
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		return r, ok, nil
	}
	c.mu.Lock()
	c.waiting++
	if c.wanted() {
		c.wake.Signal()
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
	}()
	select {
	case r, ok = <-ch:
		return r, ok, nil
	case <-ctx.Done():
		if !c.forget(id) {
			// The reader took the reply already: drop it with its fds.
			if r, ok := <-ch; ok {
				closeFDs(r.fds)
			}
		}
		return result{}, false, ctx.Err()
	}
}

// Go sends op with body req and returns once it is sent, without waiting
// for the reply: fn, if not nil, gets the reply and its fds (which it owns)
// on the goroutine that reads the connection (a later Call's, or within
// lazyRead the client's own), or (nil, nil) if the connection ends first;
// it must not block or call c. With fn nil the reply is
// dropped (its fds closed). Replies to one connection's requests keep their
// order on the server, so a later Call sees the effect of an earlier Go.
// Traced as Call is, the span ending once the request is sent.
func (c *Client) Go(ctx context.Context, op string, req any, fn func(m *Message, fds []int)) error {
	body, flow, sp, err := start(ctx, op, req)
	if err != nil {
		return err
	}
	defer sp.End()
	if fn == nil {
		fn = func(_ *Message, fds []int) { closeFDs(fds) }
	}
	id, err := c.register(&waiter{fn: fn, op: op}, true)
	if err != nil {
		return err
	}
	m := &Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Flow: flow, Body: body}
	if err := c.conn.Send(m); err != nil {
		c.forget(id)
		return c.sendFailed(op, err)
	}
	return nil
}

// Tell sends op with body req as a request that wants no reply
// (Message.NoReply) and returns once it is sent: one socket message, no
// reply to read. Its outcome, failure included, is not reported. The
// server must honour NoReply (PROTOCOL.md, "noreply"); an older server
// answers anyway, and the client drops those replies when it reads them.
// Requests of one connection are served in order, so a later Call sees
// the effect of an earlier Tell. Traced as Go is.
func (c *Client) Tell(ctx context.Context, op string, req any) error {
	body, flow, sp, err := start(ctx, op, req)
	if err != nil {
		return err
	}
	defer sp.End()
	id, err := c.register(nil, false)
	if err != nil {
		return err
	}
	m := &Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Flow: flow, Body: body, NoReply: true}
	if err := c.conn.Send(m); err != nil {
		return c.sendFailed(op, err)
	}
	return nil
}

// start is the common beginning of Call, Go and Tell: it encodes req,
// takes the context's flow id or a new one, and opens the request's trace
// span (marking the flow's start when the id is new). The caller ends sp.
func start(ctx context.Context, op string, req any) (body []byte, flow uint64, sp trace.Span, err error) {
	if body, err = MarshalBody(req); err != nil {
		return nil, 0, sp, err
	}
	flow, ok := FlowFrom(ctx)
	if !ok {
		flow = NewFlow()
	}
	sp = trace.Default().Begin(traceCategory, op)
	if !ok {
		sp.FlowOut(flow)
	}
	return body, flow, sp, nil
}

// register takes the next request id and, when w is not nil, records w as
// the request's pending waiter; lazy arms the lazy-read timer (replies to
// Go that no Call will read). It fails with the connection's error once the
// connection has ended.
func (c *Client) register(w *waiter, lazy bool) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		return 0, c.err
	}
	c.nextID++
	if w != nil {
		c.pending[c.nextID] = *w
		if w.long {
			c.long++
		}
		c.arm()
	}
	if lazy && !c.lazy {
		c.lazy = true
		c.timer.Reset(lazyRead)
	}
	return c.nextID, nil
}

// forget drops a pending call; it reports whether the call was still pending.
func (c *Client) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w, ok := c.pending[id]; ok {
		delete(c.pending, id)
		if w.long {
			c.longDone()
		}
		return true
	}
	return false
}

// Done is closed when the connection has ended. From the first call of
// Done on, the client's own goroutine reads the connection even when no
// request is in flight, so that the end is seen.
func (c *Client) Done() <-chan struct{} {
	c.mu.Lock()
	if !c.watch {
		c.watch = true
		c.wake.Signal()
	}
	c.mu.Unlock()
	return c.done
}

// Err says why the connection ended (nil while it is up, and while the
// end has not been seen: see Done).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection and waits for the reader to stop. Calls in
// flight fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.Done() // the reader sees the end
	return err
}
