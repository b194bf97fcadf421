package trace

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// Defaults of a GPUTimer.
const (
	// DefaultGPUSlots is the number of event pairs of a GPUTimer: the most
	// regions in flight (begun and not yet resolved) on one stream.
	DefaultGPUSlots = 256
	// DefaultGPUPoll is how often the poller asks whether the oldest region
	// has finished while regions are in flight.
	DefaultGPUPoll = time.Millisecond
	// CategoryGPU is the category of every GPU span.
	CategoryGPU = "gpu"
	// gpuCloseWait bounds how long Close waits for regions in flight.
	gpuCloseWait = 5 * time.Second
)

// Slot states.
const (
	slotFree  uint32 = 0
	slotBegun uint32 = 1
	slotEnded uint32 = 2
)

// GPUEvents is what a GPUTimer needs of a GPU runtime: timing events on
// one stream, with the meaning of the CUDA driver's event calls
// (cuEventCreate, cuEventRecord, cuEventQuery, cuEventElapsedTime,
// cuEventDestroy; CUDA Driver API reference, "Event Management"). An event
// is a handle; 0 is none. Package trace links no GPU library:
// libgpu/trace/cudaev implements GPUEvents for a CUDA stream, so a
// program that only reads traces (the tracer tool) links no CUDA.
type GPUEvents interface {
	// Bind makes the stream's context current on the calling OS thread.
	// The poller calls it once, on its own locked thread, before its
	// other calls.
	Bind() error
	// NewEvent creates an event that records time (never 0 without an
	// error).
	NewEvent() (uintptr, error)
	// Record enqueues ev on the stream.
	Record(ev uintptr) error
	// Query reports whether the work before ev's last record is done,
	// without waiting.
	Query(ev uintptr) (done bool, err error)
	// Elapsed is the time between two completed events in milliseconds
	// (resolution about 0.5 µs).
	Elapsed(start, end uintptr) (ms float32, err error)
	// Destroy frees ev.
	Destroy(ev uintptr)
}

type gpuSlot struct {
	start, end uintptr
	state      atomic.Uint32
	host       int64 // trace clock just before start was recorded
	cat, name  string
	nargs      uint8
	args       [MaxArgs]Arg
}

// GPUTimer measures regions of work on one CUDA stream with pairs of CUDA
// events and puts each as a span on a track of its own ("GPU: name"). Begin
// records the start event on the stream, End the end event; neither waits
// for the GPU. A poller goroutine (pinned to its OS thread, with the
// context current) asks the oldest region's end event whether it has
// completed (cuEventQuery, never a synchronize), takes cuEventElapsedTime and
// sends the span. Regions are resolved in the order they began and may nest.
//
// Begin and End belong to one goroutine, the one that queues work on the
// stream. Do not call them while the stream is being captured into a graph:
// time the graph's launches instead.
//
// When every event pair is in flight, Begin drops the region (counted in the
// Tracer's Stats). A nil *GPUTimer does nothing.
//
// Anchoring on the host clock: see doc.go, "GPU spans".
type GPUTimer struct {
	t     *Tracer
	track *Track
	ev    GPUEvents
	slots []gpuSlot
	mask  uint64
	poll  time.Duration

	tail   uint64        // next slot Begin takes (owner goroutine only)
	head   atomic.Uint64 // next slot the poller resolves
	closed atomic.Bool
	wake   chan struct{}
	// sleeping is set while the poller waits with nothing in flight; only
	// then does End wake it. While regions are in flight it polls on its own
	// timer, so a region costs its owner two event records and no wake-up.
	sleeping atomic.Bool
	quit     chan struct{}
	done     chan struct{}
	err      atomic.Pointer[error] // first CUDA error of the poller

	// poller state: the previous resolved region, kept as the chain anchor
	prevStart uintptr
	prevNS    int64
	havePrev  bool
}

// NewGPUTimer makes a timer for the stream of ev (cudaev.New(ctx, stream)
// on CUDA), whose spans go on a track named "GPU: "+name of t. The caller's
// goroutine must have the stream's context current (the events are made
// there). It returns (nil, nil) when t is nil: tracing off.
func NewGPUTimer(t *Tracer, ev GPUEvents, name string) (*GPUTimer, error) {
	if t == nil {
		return nil, nil
	}
	if ev == nil {
		return nil, errors.New("trace: NewGPUTimer: no events")
	}
	g := &GPUTimer{
		t: t, ev: ev, poll: DefaultGPUPoll,
		slots: make([]gpuSlot, DefaultGPUSlots), mask: DefaultGPUSlots - 1,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
	for i := range g.slots {
		s := &g.slots[i]
		var err error
		if s.start, err = ev.NewEvent(); err == nil {
			s.end, err = ev.NewEvent()
		}
		if err != nil {
			g.destroy()
			return nil, fmt.Errorf("trace: GPU timer events: %w", err)
		}
	}
	g.track = t.Track("GPU: " + name)
	go g.poller()
	return g, nil
}

func (g *GPUTimer) destroy() {
	for i := range g.slots {
		if g.slots[i].start != 0 {
			g.ev.Destroy(g.slots[i].start)
		}
		if g.slots[i].end != 0 {
			g.ev.Destroy(g.slots[i].end)
		}
	}
}

// GPUSpan is a region begun on a GPUTimer; End it on the same goroutine.
type GPUSpan struct {
	g *GPUTimer
	s *gpuSlot
}

// Begin records a start event on the stream and returns the region. Category
// is cat (CategoryGPU is a good one), name is what the timeline shows
// ("graph replay", "linear forward").
func (g *GPUTimer) Begin(cat, name string) GPUSpan {
	if g == nil || g.closed.Load() {
		return GPUSpan{}
	}
	// Slot head-1 is the poller's chain anchor; keep it.
	if g.tail-g.head.Load() >= uint64(len(g.slots))-1 {
		g.t.dropped.Add(1)
		return GPUSpan{}
	}
	s := &g.slots[g.tail&g.mask]
	s.cat, s.name, s.nargs = cat, name, 0
	s.host = g.t.now() // before the record: the GPU cannot pass the event earlier
	if err := g.ev.Record(s.start); err != nil {
		g.t.dropped.Add(1)
		return GPUSpan{}
	}
	s.state.Store(slotBegun)
	g.tail++
	return GPUSpan{g: g, s: s}
}

// Arg adds an argument to the region's span (at most MaxArgs).
func (s GPUSpan) Arg(a Arg) {
	if s.s == nil || s.s.nargs >= MaxArgs {
		return
	}
	s.s.args[s.s.nargs] = a
	s.s.nargs++
}

// End records the end event on the stream. A region whose end event cannot
// be recorded is still resolved by the poller, with zero duration.
func (s GPUSpan) End() {
	if s.s == nil {
		return
	}
	if err := s.g.ev.Record(s.s.end); err != nil {
		s.s.end = 0
	}
	s.s.state.Store(slotEnded)
	if s.g.sleeping.Load() {
		select {
		case s.g.wake <- struct{}{}:
		default:
		}
	}
}

// Err is the first CUDA error the poller met (nil if none).
func (g *GPUTimer) Err() error {
	if g == nil {
		return nil
	}
	if p := g.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops taking regions, waits (polling, at most 5 s) until those in
// flight are resolved and sent, and destroys the events. Call it from the
// goroutine that owns the stream, after its last End.
func (g *GPUTimer) Close() error {
	if g == nil || g.closed.Swap(true) {
		return nil
	}
	close(g.quit)
	<-g.done
	return g.Err()
}

func (g *GPUTimer) fail(err error) {
	g.err.CompareAndSwap(nil, &err)
}

func (g *GPUTimer) poller() {
	defer close(g.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := g.ev.Bind(); err != nil {
		g.fail(fmt.Errorf("trace: GPU poller: %w", err))
		return
	}
	defer g.destroy()
	var deadline time.Time
	quit := g.quit
	timer := time.NewTimer(g.poll)
	defer timer.Stop()
	for {
		for g.resolve() {
		}
		quitting := deadline != time.Time{}
		if g.inFlight() == 0 && quitting {
			return
		}
		if quitting && time.Now().After(deadline) {
			g.t.dropped.Add(uint64(g.inFlight()))
			return
		}
		var wait <-chan time.Time
		if g.inFlight() > 0 {
			timer.Reset(g.poll)
			wait = timer.C
		} else {
			// Nothing in flight: sleep until End wakes us. Re-check after
			// raising the flag, so a region ended in between is not missed.
			g.sleeping.Store(true)
			if g.inFlight() > 0 {
				g.sleeping.Store(false)
				continue
			}
		}
		select {
		case <-g.wake:
		case <-wait:
		case <-quit:
			deadline = time.Now().Add(gpuCloseWait)
			quit = nil // a closed channel would spin the select
		}
		g.sleeping.Store(false)
		if wait != nil && !timer.Stop() {
			select { // drain a fired timer before the next Reset
			case <-timer.C:
			default:
			}
		}
	}
}

// inFlight counts regions begun and not resolved. It reads the owner's tail
// through the slot states, which the owner publishes atomically.
func (g *GPUTimer) inFlight() int {
	n := 0
	for h := g.head.Load(); g.slots[h&g.mask].state.Load() != slotFree && n < len(g.slots)-1; h++ {
		n++
	}
	return n
}

// resolve turns the oldest region into a span if it has finished on the
// GPU; false when it has not (or there is none).
func (g *GPUTimer) resolve() bool {
	h := g.head.Load()
	s := &g.slots[h&g.mask]
	if s.state.Load() != slotEnded {
		return false
	}
	var durMS float32
	if s.end != 0 {
		done, err := g.ev.Query(s.end)
		if err != nil {
			g.fail(fmt.Errorf("trace: GPU event query: %w", err))
		} else if !done {
			return false
		}
		if err == nil {
			if durMS, err = g.ev.Elapsed(s.start, s.end); err != nil {
				g.fail(fmt.Errorf("trace: GPU elapsed time: %w", err))
			}
		}
	}
	seen := g.t.now() // the end has completed by now: an upper bound
	dur := int64(float64(durMS) * 1e6)
	start := s.host // lower bound: the start cannot run before it was recorded
	if g.havePrev {
		if gap, err := g.ev.Elapsed(g.prevStart, s.start); err == nil && gap >= 0 && gap < 1000 {
			start = max(start, g.prevNS+int64(float64(gap)*1e6))
		}
	}
	start = max(min(start, seen-dur), s.host)
	g.track.Complete(s.cat, s.name, start, dur, s.args[:s.nargs]...)
	// Free the previous anchor's slot; this one becomes the anchor.
	if g.havePrev {
		g.slots[(h-1)&g.mask].state.Store(slotFree)
	}
	g.prevStart, g.prevNS, g.havePrev = s.start, start, true
	if s.end == 0 { // restore an end event lost to a failed record
		s.end, _ = g.ev.NewEvent()
	}
	g.head.Store(h + 1)
	return true
}
