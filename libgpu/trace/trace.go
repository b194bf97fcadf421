package trace

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// EnvSocket names the environment variable that turns tracing on: the path of
// the collector's socket (tracer serve --socket, or set by tracer record).
const EnvSocket = "GPUKIT_TRACE"

// Network is the socket type of the collector: SOCK_SEQPACKET Unix sockets.
const Network = "unixpacket"

// ErrClosed is returned by Close on a closed Tracer.
var ErrClosed = errors.New("trace: closed")

// Options tune a Tracer; the zero value gives the defaults.
type Options struct {
	// Buffer is the number of events held between flushes (default 16384,
	// rounded up to a power of two). When it is full, new events are
	// dropped and counted.
	Buffer int
	// FlushEvery is how often the sender drains the buffer (default 20 ms).
	// It also wakes when the buffer is half full.
	FlushEvery time.Duration
	// SendTimeout bounds one send to the collector (default 100 ms); a batch
	// that cannot be sent in time is dropped and counted.
	SendTimeout time.Duration
	// Redial is the least time between two connection attempts (default 1 s).
	Redial time.Duration
}

// Stats counts a Tracer's events.
type Stats struct {
	Sent    uint64 // events handed to the collector's socket
	Dropped uint64 // events lost: buffer full, collector down or too slow
	LastErr error  // why the last send or dial failed, if one did
}

// Tracer sends the events of one process to a collector. All its methods may
// be called from any goroutine, and on a nil *Tracer (tracing off), where
// they do nothing and cost a nil check.
type Tracer struct {
	socket string
	opts   Options
	pid    uint32
	name   string
	main   Track

	// clock: CLOCK_MONOTONIC ns = base + time.Since(t0)
	t0   time.Time
	base int64

	ring    *ring
	off     atomic.Bool // set by Close
	dropped atomic.Uint64
	sent    atomic.Uint64
	nextTrk atomic.Uint32
	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}

	mu      sync.Mutex // names, lastErr, closed
	names   []Record   // track and process names, re-sent on every (re)connect
	lastErr error
	closed  bool
}

var defaultTracer atomic.Pointer[Tracer]

// Default is the process's tracer, set by SetDefault (nil: tracing off).
// Libraries that have no tracer handed to them (kernels' compiler) use it.
func Default() *Tracer { return defaultTracer.Load() }

// SetDefault makes t the process's tracer.
func SetDefault(t *Tracer) { defaultTracer.Store(t) }

// FromEnv opens a Tracer on the socket named by GPUKIT_TRACE, and makes it
// the Default; it returns nil (tracing off) when the variable is unset or
// empty. It never fails for a collector that is down: events are then
// dropped and counted.
func FromEnv(process string) *Tracer {
	return Setup("", process)
}

// Setup is what a tool's CLI calls: it opens a Tracer on socket (the
// --trace flag), or on GPUKIT_TRACE when socket is empty, makes it the
// Default and returns it; nil when neither is set. Close it before exiting.
func Setup(socket, process string) *Tracer {
	if socket == "" {
		socket = os.Getenv(EnvSocket)
	}
	if socket == "" {
		return nil
	}
	t := Open(socket, process, Options{})
	SetDefault(t)
	return t
}

// Open starts a Tracer for this process, named process in the trace (the
// program's base name when empty), sending to the collector at socket. The
// connection is made by the background sender, so Open does not fail when
// the collector is down: events are dropped and counted until it answers.
func Open(socket, process string, opts Options) *Tracer {
	if opts.Buffer <= 0 {
		opts.Buffer = 16384
	}
	if opts.FlushEvery <= 0 {
		opts.FlushEvery = 20 * time.Millisecond
	}
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = 100 * time.Millisecond
	}
	if opts.Redial <= 0 {
		opts.Redial = time.Second
	}
	if process == "" {
		process = filepath.Base(os.Args[0])
	}
	t := &Tracer{
		socket: socket, opts: opts, pid: uint32(os.Getpid()), name: process,
		ring: newRing(opts.Buffer),
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
	t.t0, t.base = monotonicBase()
	t.main = Track{t: t}
	t.names = append(t.names, Record{Kind: KindProcess, Name: process, Start: t.now()})
	go t.send()
	return t
}

// monotonicBase pairs Go's monotonic clock with CLOCK_MONOTONIC: Go's
// monotonic reading is CLOCK_MONOTONIC with a process-specific origin, so the
// offset is measured once, bracketing one clock_gettime between two
// time.Now calls (error: half the bracket, well under 1 µs).
func monotonicBase() (time.Time, int64) {
	t0 := time.Now()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	mid := time.Since(t0) / 2
	return t0, ts.Nano() - int64(mid)
}

// now is the current CLOCK_MONOTONIC time in ns.
func (t *Tracer) now() int64 { return t.base + int64(time.Since(t.t0)) }

// Now is the current time on the trace's clock (CLOCK_MONOTONIC, ns); 0 when t is nil.
func (t *Tracer) Now() int64 {
	if t == nil {
		return 0
	}
	return t.now()
}

// Enabled reports whether t records events (t is not nil).
func (t *Tracer) Enabled() bool { return t != nil }

// Stats returns the event counts so far; zero for a nil Tracer.
func (t *Tracer) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{Sent: t.sent.Load(), Dropped: t.dropped.Load(), LastErr: t.lastErr}
}

// Main is the process's main track (thread); nil for a nil Tracer.
func (t *Tracer) Main() *Track {
	if t == nil {
		return nil
	}
	return &t.main
}

// Track returns a new track (a thread row in the timeline) named name. Use one
// track per goroutine whose spans overlap others' (one per connection of a
// server, one per worker): spans on one track must nest. Nil for a nil Tracer.
func (t *Tracer) Track(name string) *Track {
	if t == nil {
		return nil
	}
	k := &Track{t: t, id: t.nextTrk.Add(1)}
	r := Record{Kind: KindTrack, Track: k.id, Name: name, Start: t.now()}
	t.mu.Lock()
	t.names = append(t.names, r)
	t.mu.Unlock()
	t.put(&r)
	return k
}

// Begin starts a span on the main track (see Track.Begin).
func (t *Tracer) Begin(cat, name string) Span { return t.Main().Begin(cat, name) }

// Instant records a point event on the main track (see Track.Instant).
func (t *Tracer) Instant(cat, name string, args ...Arg) { t.Main().Instant(cat, name, args...) }

// Counter records a sample of the process-wide counter name (a Chrome "C"
// event; one counter row per name and process). Non-finite values are dropped.
func (t *Tracer) Counter(name string, v float64) {
	if t == nil {
		return
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		t.dropped.Add(1)
		return
	}
	r := Record{Kind: KindCounter, Start: t.now(), Name: name, Value: v}
	t.put(&r)
}

func (t *Tracer) put(r *Record) {
	if t.off.Load() || !t.ring.put(r) {
		t.dropped.Add(1)
		return
	}
	if t.ring.len() == len(t.ring.slots)/2 {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Close flushes what is buffered (waiting at most about SendTimeout per
// batch), closes the connection and stops the sender. Events recorded after
// Close are dropped. A nil Tracer's Close returns nil.
func (t *Tracer) Close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	t.closed = true
	t.mu.Unlock()
	t.off.Store(true)
	close(t.quit)
	<-t.done
	defaultTracer.CompareAndSwap(t, nil)
	return nil
}

// Summary is one line for a tool to print on stderr at exit when events were
// lost ("" when none were): "trace: 12 of 3400 events dropped (...)".
func (t *Tracer) Summary() string {
	s := t.Stats()
	if s.Dropped == 0 {
		return ""
	}
	why := ""
	if s.LastErr != nil {
		why = " (" + s.LastErr.Error() + ")"
	}
	return fmt.Sprintf("trace: %d of %d events dropped%s", s.Dropped, s.Dropped+s.Sent, why)
}

// send is the background sender: it drains the ring into batches and sends
// them; when there is no connection it dials at most every Redial and
// otherwise drops what it drains.
func (t *Tracer) send() {
	defer close(t.done)
	var (
		conn     *net.UnixConn
		lastDial time.Time
		buf      = make([]byte, 0, MaxBatch)
		rec      Record
		pending  bool // rec holds a record not yet put in a batch
		tick     = time.NewTicker(t.opts.FlushEvery)
	)
	defer tick.Stop()
	setErr := func(err error) {
		t.mu.Lock()
		t.lastErr = err
		t.mu.Unlock()
	}
	dial := func() {
		lastDial = time.Now()
		c, err := net.DialUnix(Network, nil, &net.UnixAddr{Name: t.socket, Net: Network})
		if err != nil {
			setErr(fmt.Errorf("collector %s: %w", t.socket, err))
			return
		}
		if err := checkCollector(c); err != nil {
			c.Close()
			setErr(fmt.Errorf("collector %s: %w", t.socket, err))
			return
		}
		c.SetWriteBuffer(2 * MaxBatch)
		conn = c
		// A new connection first learns the process and track names.
		t.mu.Lock()
		names := append([]Record(nil), t.names...)
		t.mu.Unlock()
		b := AppendBatchHeader(buf[:0], t.pid, uint32(min(t.dropped.Load(), math.MaxUint32)), uint16(len(names)))
		for i := range names {
			b = AppendRecord(b, &names[i])
		}
		if !t.write(conn, b) {
			conn.Close()
			conn = nil
		}
	}
	flush := func(final bool) {
		if conn == nil && (final || time.Since(lastDial) >= t.opts.Redial) {
			dial()
		}
		for {
			// Fill one batch.
			b := buf[:batchHeader]
			n := 0
			for n < math.MaxUint16 {
				if !pending {
					if !t.ring.get(&rec) {
						break
					}
					pending = true
				}
				if len(b)+recordSize(&rec) > MaxBatch {
					break
				}
				b = AppendRecord(b, &rec)
				pending = false
				n++
			}
			if n == 0 {
				return
			}
			hdr := AppendBatchHeader(buf[:0], t.pid, uint32(min(t.dropped.Load(), math.MaxUint32)), uint16(n))
			copy(b, hdr)
			if conn == nil || !t.write(conn, b) {
				t.dropped.Add(uint64(n))
				if conn != nil {
					conn.Close()
					conn = nil
				}
				continue
			}
			t.sent.Add(uint64(n))
		}
	}
	for {
		select {
		case <-tick.C:
			flush(false)
		case <-t.wake:
			flush(false)
		case <-t.quit:
			flush(true)
			if conn != nil {
				conn.Close()
			}
			return
		}
	}
}

// checkCollector refuses a collector run by another user than this
// process's or root (SO_PEERCRED of the listener): events name what a
// process does, and a socket in a directory another user controls, or an
// abstract one, could be anybody's.
func checkCollector(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if self := uint32(os.Geteuid()); cred.Uid != self && cred.Uid != 0 {
		return fmt.Errorf("served by uid %d (pid %d), not by uid %d or root: not sending it events", cred.Uid, cred.Pid, self)
	}
	return nil
}

// write sends one datagram; false (with lastErr set) when it failed or timed out.
func (t *Tracer) write(c *net.UnixConn, b []byte) bool {
	c.SetWriteDeadline(time.Now().Add(t.opts.SendTimeout))
	if _, err := c.Write(b); err != nil {
		err = fmt.Errorf("send to collector %s: %w", t.socket, err)
		if why, collector := peerSaid(c); collector {
			err = fmt.Errorf("collector %s: %s", t.socket, why)
		} else if why != "" {
			err = fmt.Errorf("%s is not a tracer collector's socket: %s", t.socket, why)
		}
		t.mu.Lock()
		t.lastErr = err
		t.mu.Unlock()
		return false
	}
	return true
}

// peerSaid reads, without waiting, what a peer that closed the connection
// sent before (a collector never writes but for a notice: "GKT1!" and a
// line, such as why it refused this process): a gpukit ipc daemon
// (gpupool) answers a trace batch with an error frame, a msgpack map, and
// closes. It returns a description of the peer, or "", and whether the
// peer is a collector (then the description is its notice).
func peerSaid(c *net.UnixConn) (string, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", false
	}
	buf := make([]byte, 512)
	n := 0
	rc.Control(func(fd uintptr) {
		for range 2 { // Linux may report the reset once before the data
			m, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT)
			if m > 0 {
				n = m
				return
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				return
			}
		}
	})
	switch {
	case n == 0:
		return "", false
	case bytes.HasPrefix(buf[:n], []byte(Magic+"!")):
		return strings.ToValidUTF8(string(buf[len(Magic)+1:n]), "?"), true
	case buf[0]>>4 == 0x8 || buf[0] == 0xde || buf[0] == 0xdf:
		return "it answers in the gpukit ipc protocol (msgpack), as gpupool does", false
	}
	return fmt.Sprintf("it answered %d bytes of an unknown protocol", n), false
}

// Track is a row of the timeline within a process (a Chrome "thread"). A
// nil *Track records nothing.
type Track struct {
	t  *Tracer
	id uint32
}

// Span is a region of time on a track, recorded at End as one Chrome "X"
// event. Spans on one track must nest. The zero Span (from a nil Tracer or
// Track) records nothing. Keep a Span in a local variable: its methods take a
// pointer but it does not escape, so a span costs no allocation.
type Span struct {
	k   *Track
	rec Record
}

// Begin starts a span named name in category cat ("pool", "trainer",
// "kernels", "gpu"). cat and name should be constants or strings that live
// anyway: they are referenced, not copied, until the event is sent.
func (k *Track) Begin(cat, name string) Span {
	if k == nil {
		return Span{}
	}
	return Span{k: k, rec: Record{Kind: KindSpan, Track: k.id, Cat: cat, Name: name, Start: k.t.now()}}
}

// Arg adds an argument to the span (at most MaxArgs; more are ignored).
func (s *Span) Arg(a Arg) {
	if s.k == nil || s.rec.NArgs >= MaxArgs {
		return
	}
	s.rec.Args[s.rec.NArgs] = a
	s.rec.NArgs++
}

// FlowOut marks the span as the sender of message flow (a request's flow id,
// ipc.Message.Flow): the timeline draws an arrow from it to the span that
// calls FlowIn with the same id, in this or another process. Zero is ignored.
func (s *Span) FlowOut(flow uint64) {
	if s.k != nil && flow != 0 {
		s.rec.Flow, s.rec.FlowDir = flow, FlowOut
	}
}

// FlowIn marks the span as the handler of message flow (see FlowOut).
func (s *Span) FlowIn(flow uint64) {
	if s.k != nil && flow != 0 {
		s.rec.Flow, s.rec.FlowDir = flow, FlowIn
	}
}

// End records the span; a second End records it again.
func (s *Span) End() {
	if s.k == nil {
		return
	}
	s.rec.Dur = max(0, s.k.t.now()-s.rec.Start)
	s.k.t.put(&s.rec)
}

// Instant records a point event on the track (Chrome "i", thread scope).
func (k *Track) Instant(cat, name string, args ...Arg) {
	if k == nil {
		return
	}
	r := Record{Kind: KindInstant, Track: k.id, Cat: cat, Name: name, Start: k.t.now()}
	r.NArgs = uint8(copy(r.Args[:], args))
	k.t.put(&r)
}

// Complete records a span measured elsewhere: start on the trace's clock
// (Tracer.Now, ns) and dur in ns (negative is taken as 0).
func (k *Track) Complete(cat, name string, start, dur int64, args ...Arg) {
	if k == nil {
		return
	}
	r := Record{Kind: KindSpan, Track: k.id, Cat: cat, Name: name, Start: start, Dur: max(0, dur)}
	r.NArgs = uint8(copy(r.Args[:], args))
	k.t.put(&r)
}
