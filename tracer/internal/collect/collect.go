package collect

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/trace"
	"gpukit/tracer/internal/chrome"
)

// maxPendingFlows bounds the flow ends waiting for their other end;
// maxConnFlows those one connection may have waiting (past it, its own
// oldest go first, so one connection cannot push out the others' ends).
const (
	maxPendingFlows = 1 << 16
	maxConnFlows    = 1 << 12
)

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
	Refused       uint64 // connections of peers not admitted (Collector.Admission)
	Batches       uint64
	Records       uint64
	Rejected      uint64 // batches refused: malformed, or naming another process (Foreign)
	Foreign       uint64 // of Rejected: batches whose pid was not their connection's
	Written       uint64 // events in the file, M events included
	Capped        uint64 // events refused by the size cap
	Lost          uint64 // events the file does not hold because writing it failed (a full disk)
	ClientDropped uint64 // events the clients said they dropped (sum over processes)
	Processes     int    // processes whose events were taken
	UnpairedFlows int    // flow ends that never met their other end
	Conns         int    // connections open
}

type flowEnd struct {
	dir      uint8
	ts       int64
	pid, tid uint32
	owner    *peer // the connection that sent it (nil: Ingest)
}

type proc struct {
	named   bool
	name    string
	threads map[uint32]bool // at most 1024: tid maps tracks modulo 1023
	dropped uint32
	conns   int // connections writing for it; its state goes with the last
}

// peer is one connection's state: bounded, and freed when it closes.
type peer struct {
	pid uint32 // SO_PEERCRED: the only pid it may write for
	// nsPID: the process runs in another pid namespace, where it knows
	// itself by another number: its batches' pid is replaced by pid.
	nsPID   bool
	proc    *proc
	flows   []uint64 // flow ids it left waiting, oldest first (some paired since)
	pending int      // of which still waiting
}

// Collector writes the events of every connected process into one trace file.
//
// A connection writes for its own process only: its peer's pid
// (SO_PEERCRED) is the pid of every event it sends; a batch naming another
// pid is refused and counted (a process in another pid namespace, which
// knows itself by another number, has its events put under the pid this
// collector sees). What a connection holds (its process's names, the flow
// ends it left waiting, at most maxConnFlows) is bounded and, but for the
// flow ends another process's events may still complete, freed when it
// closes.
type Collector struct {
	mu        sync.Mutex
	w         *chrome.Writer
	buf       []byte
	procs     map[uint32]*proc
	seen      map[uint32]struct{} // pids whose events were taken
	flows     map[uint64]flowEnd
	flowOrder []uint64
	stats     Stats
	done      bool
	stopping  atomic.Bool
	// MaxConns bounds the open connections (0: DefaultMaxConns); set it
	// before Serve.
	MaxConns int
	// Admission says whose connections are served (New: this process's
	// uid and root); a peer it refuses gets a notice and is closed. Set it
	// before Serve.
	Admission ipc.Admission

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
	c := &Collector{w: w, procs: map[uint32]*proc{}, seen: map[uint32]struct{}{}, flows: map[uint64]flowEnd{},
		conns: map[*net.UnixConn]bool{}, flushQ: make(chan struct{}),
		Admission: ipc.Admission{Self: uint32(os.Geteuid()), Root: true}}
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
	pr := &peer{}
	defer func() {
		c.mu.Lock()
		delete(c.conns, conn)
		c.forget(pr)
		c.mu.Unlock()
		conn.Close()
	}()
	cred, err := ipc.UnixPeerCred(conn)
	if err == nil {
		err = c.Admission.Check(cred)
	}
	if err != nil {
		c.mu.Lock()
		c.stats.Refused++
		c.mu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write([]byte(trace.Magic + "!refused: " + err.Error()))
		return
	}
	pr.pid, pr.nsPID = uint32(cred.PID), otherPIDNamespace(cred.PID)
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
			c.ingestFrom(&b, pr)
		}
		c.mu.Unlock()
	}
}

// otherPIDNamespace reports whether pid lives in another pid namespace
// than this process (false when that cannot be read: a process of another
// uid, to a collector that is not root).
func otherPIDNamespace(pid int32) bool {
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false
	}
	other, err := os.Readlink("/proc/" + strconv.Itoa(int(pid)) + "/ns/pid")
	return err == nil && other != self
}

// ingestFrom takes a batch that came on pr's connection: only for pr's
// process. Called with c.mu held.
func (c *Collector) ingestFrom(b *trace.Batch, pr *peer) {
	if b.PID != pr.pid {
		if !pr.nsPID {
			c.stats.Rejected++
			c.stats.Foreign++
			return
		}
		b.PID = pr.pid
	}
	if pr.proc == nil {
		pr.proc = c.procs[pr.pid]
		if pr.proc == nil {
			name := ""
			if len(b.Records) > 0 && b.Records[0].Kind == trace.KindProcess {
				name = b.Records[0].Name
			}
			pr.proc = c.process(pr.pid, name)
		}
		pr.proc.conns++
	}
	c.ingest(b, pr)
}

// forget frees what a closed connection held: its process's state, when
// no other connection writes for it, and its count of waiting flow ends
// (the ends stay, for another process's events to complete). Called with
// c.mu held.
func (c *Collector) forget(pr *peer) {
	if pr.proc != nil {
		if pr.proc.conns--; pr.proc.conns == 0 && c.procs[pr.pid] == pr.proc {
			delete(c.procs, pr.pid)
		}
		pr.proc = nil
	}
	for _, id := range pr.flows {
		if e, ok := c.flows[id]; ok && e.owner == pr {
			e.owner = nil
			c.flows[id] = e
		}
	}
	pr.flows, pr.pending = nil, 0
}

// Ingest adds one decoded batch for the process it names (no connection's
// rules apply: a caller in this process vouches for it).
func (c *Collector) Ingest(b *trace.Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ingest(b, nil)
}

func tid(pid, track uint32) uint32 {
	if track == 0 {
		return pid
	}
	return pid + (1+(track-1)%1023)<<22
}

func (c *Collector) add(ev []byte) { c.w.Add(ev) }

// process names pid (once named, a later name replaces it).
func (c *Collector) process(pid uint32, name string) *proc {
	p := c.procs[pid]
	if p == nil {
		p = &proc{threads: map[uint32]bool{}}
		c.procs[pid] = p
		c.seen[pid] = struct{}{}
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

// ingest writes a batch's events; pr is the connection it came on (nil:
// Ingest). Called with c.mu held.
func (c *Collector) ingest(b *trace.Batch, pr *peer) {
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
				c.flow(r.Flow, flowEnd{dir: r.FlowDir, ts: r.Start, pid: pid, tid: t, owner: pr})
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
		if ok {
			c.disown(o)
		} else {
			if len(c.flows) >= maxPendingFlows {
				c.evictFlow()
			}
			c.flowOrder = append(c.flowOrder, id)
		}
		c.flows[id] = e
		if pr := e.owner; pr != nil {
			if pr.pending >= maxConnFlows {
				c.evictOwn(pr)
			}
			pr.flows = append(pr.flows, id)
			pr.pending++
			if len(pr.flows) > 2*pr.pending+64 {
				keep := pr.flows[:0]
				for _, f := range pr.flows {
					if w, ok := c.flows[f]; ok && w.owner == pr {
						keep = append(keep, f)
					}
				}
				pr.flows = slices.Clip(keep)
			}
		}
		c.compact()
		return
	}
	delete(c.flows, id)
	c.disown(o)
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
	c.compact()
}

// disown takes a waiting end off its connection's count.
func (c *Collector) disown(e flowEnd) {
	if e.owner != nil {
		e.owner.pending--
	}
}

// evictFlow drops the oldest waiting flow end of all.
func (c *Collector) evictFlow() {
	for len(c.flowOrder) > 0 {
		id := c.flowOrder[0]
		c.flowOrder = c.flowOrder[1:]
		if e, ok := c.flows[id]; ok {
			delete(c.flows, id)
			c.disown(e)
			return
		}
	}
}

// evictOwn drops pr's oldest waiting flow end.
func (c *Collector) evictOwn(pr *peer) {
	for len(pr.flows) > 0 {
		id := pr.flows[0]
		pr.flows = pr.flows[1:]
		if e, ok := c.flows[id]; ok && e.owner == pr {
			delete(c.flows, id)
			pr.pending--
			return
		}
	}
}

// compact drops ids of paired or evicted flows from the order lists once
// they are mostly such, so that their memory stays proportional to the
// ends still waiting.
func (c *Collector) compact() {
	if len(c.flowOrder) > 2*len(c.flows)+1024 {
		keep := c.flowOrder[:0]
		for _, id := range c.flowOrder {
			if _, ok := c.flows[id]; ok {
				keep = append(keep, id)
			}
		}
		c.flowOrder = slices.Clip(keep)
	}
}

// Stats returns the counts so far.
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Written = c.w.Written()
	s.Capped = c.w.Capped()
	s.Lost = c.w.Lost()
	s.Processes = len(c.seen)
	s.UnpairedFlows = len(c.flows)
	s.Conns = len(c.conns)
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
	}{{"tracer.rejected_batches", c.stats.Rejected}, {"tracer.unpaired_flows", uint64(len(c.flows))}, {"tracer.refused_connections", c.stats.Refused}} {
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
