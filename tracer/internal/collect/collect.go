package collect

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

// maxPendingFlows bounds the flow ends waiting for their other end.
const maxPendingFlows = 1 << 16

// DefaultMaxConns bounds the connections a Collector serves at once (one
// per traced process); more are closed at once (Collector.MaxConns).
const DefaultMaxConns = 1024

// notice is what the collector sends a peer whose first datagram is not a
// trace batch (a gpupool client given the tracer's socket, say) before it
// closes the connection: the trace magic, so the peer can tell whose
// socket it reached.
const notice = trace.Magic + "!this is a gpukit tracer collector: it takes trace batches only"

// flowName and flowCat name every flow pair (both ends must agree).
const (
	flowName = "message"
	flowCat  = "flow"
)

// Stats counts what the collector saw.
type Stats struct {
	Connections   uint64
	Batches       uint64
	Records       uint64
	Rejected      uint64 // malformed batches refused
	Written       uint64 // events in the file, M events included
	Capped        uint64 // events refused by the size cap
	ClientDropped uint64 // events the clients said they dropped (sum over processes)
	Processes     int
	UnpairedFlows int // flow ends that never met their other end
}

type flowEnd struct {
	dir      uint8
	ts       int64
	pid, tid uint32
}

type proc struct {
	named   bool
	name    string
	threads map[uint32]bool
	dropped uint32
}

// Collector writes the events of every connected process into one trace file.
type Collector struct {
	mu        sync.Mutex
	w         *chrome.Writer
	buf       []byte
	procs     map[uint32]*proc
	flows     map[uint64]flowEnd
	flowOrder []uint64
	stats     Stats
	done      bool
	stopping  atomic.Bool
	// MaxConns bounds the open connections (0: DefaultMaxConns); set it
	// before Serve.
	MaxConns int

	conns   map[*net.UnixConn]bool
	connsWG sync.WaitGroup
	flushQ  chan struct{}
	flushWG sync.WaitGroup
	flushE  error
}

// New starts a collector writing to w; it flushes w every flushEvery (0: 100 ms).
func New(w *chrome.Writer, flushEvery time.Duration) *Collector {
	if flushEvery <= 0 {
		flushEvery = 100 * time.Millisecond
	}
	c := &Collector{w: w, procs: map[uint32]*proc{}, flows: map[uint64]flowEnd{},
		conns: map[*net.UnixConn]bool{}, flushQ: make(chan struct{})}
	c.flushWG.Add(1)
	go func() {
		defer c.flushWG.Done()
		tick := time.NewTicker(flushEvery)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				c.mu.Lock()
				if err := c.w.Flush(); err != nil && c.flushE == nil {
					c.flushE = err
				}
				c.mu.Unlock()
			case <-c.flushQ:
				return
			}
		}
	}()
	// The collector is a process of the trace too.
	c.mu.Lock()
	c.process(uint32(os.Getpid()), "tracer (collector)")
	c.mu.Unlock()
	return c
}

// StopServing makes Serve(l) return after it has accepted the connections
// already waiting in l's backlog (a process that connected, sent and exited
// just before is not lost). Close l after Serve has returned.
func (c *Collector) StopServing(l *net.UnixListener) {
	c.stopping.Store(true)
	l.SetDeadline(time.Now().Add(20 * time.Millisecond))
}

// Serve accepts connections on l until l is closed or StopServing; it
// returns nil then. It does not stop for a failed accept (out of file
// descriptors, say): it retries after a pause that doubles from 5 ms to
// 1 s. Past MaxConns a connection is closed at once.
func (c *Collector) Serve(l *net.UnixListener) error {
	var pause time.Duration
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if c.stopping.Load() {
					return nil
				}
				continue
			}
			if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSOCK) || errors.Is(err, syscall.EBADF) {
				return fmt.Errorf("collect: accept: %w", err)
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			time.Sleep(pause)
			continue
		}
		pause = 0
		c.mu.Lock()
		max := c.MaxConns
		if max <= 0 {
			max = DefaultMaxConns
		}
		if c.done || len(c.conns) >= max {
			c.mu.Unlock()
			conn.Close()
			continue
		}
		c.conns[conn] = true
		c.stats.Connections++
		c.connsWG.Add(1)
		c.mu.Unlock()
		go c.serveConn(conn)
	}
}

func (c *Collector) serveConn(conn *net.UnixConn) {
	defer c.connsWG.Done()
	defer func() {
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
		conn.Close()
	}()
	buf := make([]byte, trace.MaxBatch+1)
	for first := true; ; first = false {
		n, err := conn.Read(buf)
		if err != nil || n == 0 {
			return
		}
		if first && !bytes.HasPrefix(buf[:n], []byte(trace.Magic)) {
			// Not a trace client: say whose socket this is, and end.
			c.mu.Lock()
			c.stats.Rejected++
			c.mu.Unlock()
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			conn.Write([]byte(notice))
			return
		}
		b, err := trace.DecodeBatch(buf[:n])
		c.mu.Lock()
		if err != nil {
			c.stats.Rejected++
		} else {
			c.ingest(&b)
		}
		c.mu.Unlock()
	}
}

// Ingest adds one decoded batch, as if it came from a connection.
func (c *Collector) Ingest(b *trace.Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ingest(b)
}

func tid(pid, track uint32) uint32 {
	if track == 0 {
		return pid
	}
	return pid + (1+(track-1)%1023)<<22
}

func (c *Collector) add(ev []byte) {
	if c.w.Add(ev) {
		c.stats.Written++
	}
}

// process names pid (once named, a later name replaces it).
func (c *Collector) process(pid uint32, name string) *proc {
	p := c.procs[pid]
	if p == nil {
		p = &proc{threads: map[uint32]bool{}}
		c.procs[pid] = p
	}
	if (name != "" && name != p.name) || !p.named {
		if name == "" {
			name = "pid " + strconv.FormatUint(uint64(pid), 10)
		}
		p.name = name
		c.buf = chrome.Meta(c.buf[:0], "process_name", pid, pid, name)
		c.add(c.buf)
		p.named = true
	}
	return p
}

// thread names (pid, track) when named is given or it has no name yet.
func (c *Collector) thread(p *proc, pid, track uint32, name string) uint32 {
	t := tid(pid, track)
	if name != "" || !p.threads[t] {
		if name == "" {
			name = "main"
			if track != 0 {
				name = "track " + strconv.FormatUint(uint64(track), 10)
			}
		}
		c.buf = chrome.Meta(c.buf[:0], "thread_name", pid, t, name)
		c.add(c.buf)
		p.threads[t] = true
	}
	return t
}

func appendArgs(b []byte, r *trace.Record) []byte {
	if r.NArgs == 0 {
		return b
	}
	b = append(b, `,"args":{`...)
	for i := 0; i < int(r.NArgs); i++ {
		a := &r.Args[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = chrome.AppendString(b, a.Key)
		b = append(b, ':')
		switch v := a.Value().(type) {
		case int64:
			b = strconv.AppendInt(b, v, 10)
		case float64:
			b = chrome.AppendFloat(b, v)
		case string:
			b = chrome.AppendString(b, v)
		}
	}
	return append(b, '}')
}

func (c *Collector) ingest(b *trace.Batch) {
	c.stats.Batches++
	pid := b.PID
	p := c.procs[pid]
	if p == nil {
		name := ""
		if len(b.Records) > 0 && b.Records[0].Kind == trace.KindProcess {
			name = b.Records[0].Name
		}
		p = c.process(pid, name)
	}
	if b.Dropped > p.dropped {
		c.stats.ClientDropped += uint64(b.Dropped - p.dropped)
		p.dropped = b.Dropped
		c.buf = chrome.Head(c.buf[:0], 'C', "trace.dropped", "", monoNow(), pid, pid)
		c.buf = append(c.buf, `,"args":{"value":`...)
		c.buf = strconv.AppendUint(c.buf, uint64(b.Dropped), 10)
		c.buf = append(c.buf, "}}"...)
		c.add(c.buf)
	}
	for i := range b.Records {
		r := &b.Records[i]
		c.stats.Records++
		switch r.Kind {
		case trace.KindProcess:
			c.process(pid, r.Name)
		case trace.KindTrack:
			c.thread(p, pid, r.Track, r.Name)
		case trace.KindCounter:
			c.buf = chrome.Head(c.buf[:0], 'C', r.Name, "", r.Start, pid, pid)
			c.buf = append(c.buf, `,"args":{"value":`...)
			c.buf = chrome.AppendFloat(c.buf, r.Value)
			c.add(append(c.buf, "}}"...))
		case trace.KindInstant:
			t := c.thread(p, pid, r.Track, "")
			c.buf = chrome.Head(c.buf[:0], 'i', r.Name, r.Cat, r.Start, pid, t)
			c.buf = append(c.buf, `,"s":"t"`...)
			c.buf = appendArgs(c.buf, r)
			c.add(append(c.buf, '}'))
		case trace.KindSpan:
			t := c.thread(p, pid, r.Track, "")
			c.buf = chrome.Head(c.buf[:0], 'X', r.Name, r.Cat, r.Start, pid, t)
			c.buf = append(c.buf, `,"dur":`...)
			c.buf = chrome.AppendMicros(c.buf, r.Dur)
			c.buf = appendArgs(c.buf, r)
			c.add(append(c.buf, '}'))
			if r.FlowDir != trace.FlowNone {
				c.flow(r.Flow, flowEnd{dir: r.FlowDir, ts: r.Start, pid: pid, tid: t})
			}
		}
	}
}

// flow holds one end of a flow until the other arrives, then writes both.
// Ids are cut to 53 bits so that JSON readers in JavaScript keep them exact.
func (c *Collector) flow(id uint64, e flowEnd) {
	id &= 1<<53 - 1
	if id == 0 {
		id = 1
	}
	o, ok := c.flows[id]
	if !ok || o.dir == e.dir {
		if !ok {
			if len(c.flows) >= maxPendingFlows {
				c.evictFlow()
			}
			c.flowOrder = append(c.flowOrder, id)
		}
		c.flows[id] = e
		return
	}
	delete(c.flows, id)
	out, in := o, e
	if o.dir == trace.FlowIn {
		out, in = e, o
	}
	for _, end := range []struct {
		ph byte
		e  flowEnd
	}{{'s', out}, {'f', in}} {
		c.buf = chrome.Head(c.buf[:0], end.ph, flowName, flowCat, end.e.ts, end.e.pid, end.e.tid)
		c.buf = append(c.buf, `,"id":`...)
		c.buf = strconv.AppendUint(c.buf, id, 10)
		if end.ph == 'f' {
			c.buf = append(c.buf, `,"bp":"e"`...)
		}
		c.add(append(c.buf, '}'))
	}
}

func (c *Collector) evictFlow() {
	for len(c.flowOrder) > 0 {
		id := c.flowOrder[0]
		c.flowOrder = c.flowOrder[1:]
		if _, ok := c.flows[id]; ok {
			delete(c.flows, id)
			return
		}
	}
}

// Stats returns the counts so far.
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Capped = c.w.Capped()
	s.Processes = len(c.procs)
	s.UnpairedFlows = len(c.flows)
	return s
}

// Idle reports whether no connection is open.
func (c *Collector) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns) == 0
}

// Drain waits until every open connection has ended (its process closed it
// or exited: what it sent before is read first), at most timeout; then it
// closes the ones left.
func (c *Collector) Drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for !c.Idle() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	c.mu.Lock()
	for conn := range c.conns {
		conn.SetReadDeadline(time.Now())
	}
	c.mu.Unlock()
	c.connsWG.Wait()
}

// Close stops taking batches, writes the collector's counters and closes the
// file; the listener is the caller's. Call Drain first to keep what open
// connections still hold.
func (c *Collector) Close() error {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return chrome.ErrClosed
	}
	c.done = true
	for conn := range c.conns {
		conn.SetReadDeadline(time.Now())
	}
	c.mu.Unlock()
	c.connsWG.Wait()
	close(c.flushQ)
	c.flushWG.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	self := uint32(os.Getpid())
	now := monoNow()
	for _, kv := range []struct {
		name string
		v    uint64
	}{{"tracer.rejected_batches", c.stats.Rejected}, {"tracer.unpaired_flows", uint64(len(c.flows))}} {
		c.buf = chrome.Head(c.buf[:0], 'C', kv.name, "", now, self, self)
		c.buf = append(c.buf, `,"args":{"value":`...)
		c.buf = strconv.AppendUint(c.buf, kv.v, 10)
		c.add(append(c.buf, "}}"...))
	}
	err := c.w.Close()
	if c.flushE != nil {
		err = c.flushE
	}
	return err
}
