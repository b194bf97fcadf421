package optim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// RootOptions are how Shampoo, SOAP and K-FAC compute their
// preconditioners (inverse roots or eigenbases) from their statistics.
type RootOptions struct {
	// Method: ops.RootEigen (default) or ops.RootNewton (SOAP always
	// decomposes: its preconditioner is the eigenbasis).
	Method ops.RootMethod
	// NewtonIters: iterations of ops.RootNewton (0: ops.NewtonIters).
	NewtonIters int
	// Async computes the preconditioners off the step's critical path, on
	// the engine's side stream (ops.Engine.Side), from a snapshot of the
	// statistics taken when they are due; the step that uses them waits
	// for nothing unless they are still running MaxStaleness steps later.
	Async bool
	// MaxStaleness is how many steps after its refresh a preconditioner
	// is put in use (Async only; 0 ≤ MaxStaleness ≤ the refresh
	// interval): 0 uses it in the step it was refreshed (the same values
	// as synchronous roots), K uses it from K steps later, so the side
	// stream has K steps of time to compute it. The schedule is fixed, so
	// runs are reproducible whatever the timing.
	MaxStaleness int
}

// RootStats count what the preconditioner refreshes did.
type RootStats struct {
	Refreshes int // refreshes started
	Failures  int // matrices whose root or decomposition failed (kept their previous value, or at the first refresh were recomputed)
	F64       int // jobs switched to float64 eigendecomposition after a failure
	// Retried counts jobs returned from float64 to their own method after
	// f64Hold refreshes (a switch is not for ever: see f64Hold).
	Retried int
	// Asynchronous refreshes put in use whose wait the device has timed
	// (all but the last: timed between two events on the main stream
	// around its wait for the side stream, read at the next one), those
	// the main stream waited more than 10 µs for, and the main stream's
	// total wait (ms). 0 on the host, where side work runs at once.
	Timed, Waited int
	WaitMS        float64
	// The host's side of the refreshes (wall-clock ms, summed over
	// refreshes started): CheckMS waiting to read the previous refresh's
	// statuses (checkFailures: its status copy must have run, so a refresh
	// that outlasts the interval shows here), QueueMS queueing the refresh
	// (snapshots, and the jobs' work on the side stream: a library call
	// that blocks the calling thread shows here). Either one stalls the
	// host, and the main stream runs dry behind it.
	CheckMS, QueueMS float64
	// Replayed counts job refreshes replayed from a captured graph
	// (rootSched.sideRefresh), Uncaptured the jobs whose refresh could not
	// be captured and stays eager.
	Replayed, Uncaptured int
	// Blocks counts the matrices this process computed at its refreshes
	// (blocks of Shampoo's and SOAP's stacked statistics, K-FAC layers),
	// summed over refreshes: with the refreshes shared over data-parallel
	// ranks (ShareRoots) each rank computes its share of them.
	Blocks int
	// RefreshesTimed asynchronous refreshes took RefreshMS of GPU time on
	// the side stream, from its first kernel's start to its last one's end
	// (read at the next refresh; a GPU only): what a refresh costs the
	// device, which ShareRoots divides among the ranks.
	RefreshesTimed int
	RefreshMS      float64
}

// f64Hold is how many refreshes a job switched to float64
// eigendecomposition stays there before its own method (Newton's roots,
// f32 decompositions) is tried again; a failure then switches it back.
// The switch is mostly made at the first refresh, from statistics of one
// gradient — rank-deficient for every block with more rows than the
// gradient has (a 576×384 block's 576×576 statistics have rank 384), so
// the ridge alone sets their condition (1/RelEps) and f32 Newton fails —
// and a later refresh's statistics, summed over tens of gradients, are
// full rank. cuSOLVER's float64 eigensolver works partly on the host: on a
// GPU machine (2026-11-28) Shampoo's three such jobs of the
// shakespeare-char GPT held the host 141 ms a refresh, for the whole run.
const f64Hold = 10

// waitThreshold is the main stream's wait for a refresh that counts as
// one (RootStats.Waited): above the timing events' own resolution.
const waitThreshold = 0.01 // ms

// rootJob is one piece of preconditioner work: compute reads statistics
// src and writes results dst (roots, eigenbases; dst holds the previous
// results, which a refresh may start from, as SOAP's power iteration
// does; first says whether this is the first refresh), and returns a status
// tensor ([count] f32 residuals — a failure is a value not below 1 — or
// [count] i32 statuses — a failure is non-zero). The scheduler keeps the
// last refresh's status as state and reads it at the next refresh, a
// refresh interval later (when it is long computed), to switch a failing
// job to float64 eigendecomposition (for f64Hold refreshes, then its own
// method is tried again): a fixed point of the schedule, so runs and
// resumed runs decide alike. A failed matrix keeps its previous
// result meanwhile — except at the first refresh, where there is none
// (dst holds the identities it starts with, which would silently turn
// the preconditioned step into another one): the first refresh's status
// is read at once (one host wait per run) and a failing job is recomputed
// in float64 before its results are used (rootSched.verifyFirst).
//
// A stacked job's src, dst and status all stack the same number of blocks
// along their first dimension, each block computed on its own, so a
// refresh may compute any range of them (a span): compute is given src and
// dst narrowed to the span and narrows its own scratch and status alike.
// Other jobs are computed whole (the span all).
type rootJob struct {
	name    string
	src     []*tensor.Tensor
	dst     []*tensor.Tensor
	compute func(e *ops.Engine, src, dst []*tensor.Tensor, part span, f64, first bool) (*tensor.Tensor, error)
	stacked bool

	// own is the part this process computes at a refresh (all unless the
	// refreshes are shared, when it may be empty); parts[q] is rank q's
	// (nil: not shared).
	own   span
	parts []span

	snap, pend []*tensor.Tensor // Async: state copies of src, work copies of dst
	// f64At is the step of the refresh that switched the job to float64
	// eigendecomposition (≥ start ≥ 1), 0 while it runs its own method.
	f64At int

	status *tensor.Tensor // state: the last refresh's status (allocated at its first refresh's shape)
	f64s   *tensor.Tensor // state [1] i32: f64At while the job runs in float64, else 0
	ev     *exec.Event    // recorded after the status copy, in this process
	stage  *exec.Staging  // host copy of status, queued behind it (read without a device-wide sync)

	// Asynchronous refreshes after the first replay one graph of the job's
	// side-stream work (compute and the status copies), captured on the side
	// stream at the second refresh of each precision (the first ran eagerly:
	// kernels compiled, scratch sized), indexed by f64; eager marks the
	// precisions whose work failed to capture (a library call that
	// synchronises), which stay eager.
	graphs [2]*exec.CapturedGraph
	warm   [2]bool
	eager  [2]bool
}

// inF64 reports whether the job runs in float64 eigendecomposition.
func (j *rootJob) inF64() bool { return j.f64At != 0 }

// span is the blocks [lo, lo+n) of a stacked job; all (n < 0) is a whole
// job, stacked or not.
type span struct{ lo, n int }

var all = span{n: -1}

// empty reports a span of no block (a shared job's part on a rank that
// computes none of it).
func (s span) empty() bool { return s.n == 0 }

// blocks is the number of matrices the span computes of job j (a whole
// job that is not stacked counts as one).
func (s span) blocks(j *rootJob) int {
	switch {
	case s.n >= 0:
		return s.n
	case j.stacked:
		return j.src[0].Shape[0]
	}
	return 1
}

// of is t narrowed to the span along its first dimension (t itself for
// all).
func (s span) of(t *tensor.Tensor) (*tensor.Tensor, error) {
	if s.n < 0 {
		return t, nil
	}
	return t.Narrow(0, s.lo, s.n)
}

// ofAll is of over ts.
func (s span) ofAll(ts []*tensor.Tensor) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		v, err := s.of(t)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// run computes part of job j from src into dst (whole tensors, narrowed
// here) and returns the part's status.
func (j *rootJob) run(e *ops.Engine, src, dst []*tensor.Tensor, part span, f64, first bool) (*tensor.Tensor, error) {
	s, err := part.ofAll(src)
	if err != nil {
		return nil, err
	}
	d, err := part.ofAll(dst)
	if err != nil {
		return nil, err
	}
	st, err := j.compute(e, s, d, part, f64, first)
	if err != nil {
		return nil, fmt.Errorf("optim: %s: %w", j.name, err)
	}
	return st, nil
}

// rootSched runs an optimizer's rootJobs on a fixed schedule: at steps t ≥
// start with (t − start) % every = 0, synchronously, or asynchronously
// with results put in use at t + staleness.
type rootSched struct {
	opts         RootOptions
	start, every int
	jobs         []*rootJob
	done         *exec.Event // the side stream's last refresh
	waitA, waitB *exec.Event // timing events around the main stream's wait at the last publish
	timing       bool        // waitA and waitB hold an untimed publish
	pendingT     int         // the async refresh not yet in use (0: none)
	resumed      bool        // the first step after construction has run
	stats        RootStats
	// use, when set, runs on the main stream once the results of the
	// refresh of step t are put in use (after the synchronous refresh, or
	// after an asynchronous one's results are copied into dst): SOAP
	// permutes its second moment there.
	use func(e *ops.Engine, t int) error
	// graphE is the engine the jobs' refresh graphs were captured on.
	graphE *ops.Engine
	// comm shares the refreshes over data-parallel ranks (share; nil:
	// this process computes every job).
	comm RootComm
	// sideA, recorded on the side stream before an asynchronous refresh,
	// times it against done (a GPU only); refreshTiming: the last refresh
	// is not yet in the stats.
	sideA         *exec.Event
	refreshTiming bool
}

// RootComm is what refreshes shared over data-parallel ranks need of
// their communicator (ShareRoots): a *nccl.Comm, or nccltest's in-process
// stand-in on the host. Broadcast queues dst = root's dst on every rank
// (src nil: in place) on the engine's stream; Group launches the
// collectives fn queues together.
type RootComm interface {
	Rank() int
	Size() int
	Broadcast(e *ops.Engine, dst, src *tensor.Tensor, root int) error
	Group(e *ops.Engine, fn func() error) error
}

// ShareRoots splits o's preconditioner refreshes over the data-parallel
// ranks of c, as Distributed Shampoo distributes its preconditioners
// (Shi et al., "A Distributed Data-Parallel PyTorch Implementation of the
// Distributed Shampoo Optimizer", arXiv 2309.06497, §3.1): each rank
// computes its part of every refresh and the parts are broadcast from
// their ranks when the refresh is put in use, so a refresh's device time
// falls with the ranks while every rank ends with the same
// preconditioners. Shampoo's and SOAP's stacked blocks of each order are
// cut into one contiguous range a rank, the ranges' sizes differing by
// one at most and the larger ones given to the ranks with the least work
// so far; K-FAC's layers go whole, the largest first (by the cube of their
// factors' orders), each to the rank with the least work so far. Every
// rank must call it with its own communicator of the same ranks, before
// o's first step; the steps then exchange over c in the same order on
// every rank (the same step on every rank, as data parallelism has it).
// It reports false, and changes nothing, for an optimizer without
// refreshes or a communicator of one rank. Checkpoints are unchanged.
func ShareRoots(o Optimizer, c RootComm) (bool, error) {
	s, ok := o.(interface{ shareRoots(RootComm) error })
	if !ok || c == nil || c.Size() <= 1 {
		return false, nil
	}
	return true, s.shareRoots(c)
}

// shareRoots implements ShareRoots for Shampoo, SOAP and K-FAC.
func (r *rooted) shareRoots(c RootComm) error {
	if r.step.t >= 0 || r.sched.resumed {
		return fmt.Errorf("%w: refreshes shared after the first step", ErrConfig)
	}
	return r.sched.share(c.Rank(), c.Size(), c)
}

// share plans each job's parts over n ranks (ShareRoots) and sets this
// rank's.
func (r *rootSched) share(rank, n int, c RootComm) error {
	if rank < 0 || rank >= n {
		return fmt.Errorf("%w: rank %d of %d", ErrConfig, rank, n)
	}
	load := make([]float64, n)
	least := func(qs []int) { // qs: ranks, least loaded first (lowest rank on ties)
		slices.SortStableFunc(qs, func(a, b int) int { return cmp.Compare(load[a], load[b]) })
	}
	var whole []*rootJob
	for _, j := range r.jobs {
		if !j.stacked {
			whole = append(whole, j)
			continue
		}
		count := j.src[0].Shape[0]
		per := rootCost(j) / float64(count)
		size := make([]int, n)
		qs := make([]int, n)
		for q := range n {
			size[q], qs[q] = count/n, q
		}
		least(qs)
		for _, q := range qs[:count%n] {
			size[q]++
		}
		j.parts = make([]span, n)
		lo := 0
		for q := range n {
			j.parts[q] = span{lo, size[q]}
			lo += size[q]
			load[q] += per * float64(size[q])
		}
	}
	slices.SortStableFunc(whole, func(a, b *rootJob) int { return cmp.Compare(rootCost(b), rootCost(a)) })
	for _, j := range whole {
		qs := make([]int, n)
		for q := range n {
			qs[q] = q
		}
		least(qs)
		j.parts = make([]span, n) // empty but for the owner's
		j.parts[qs[0]] = all
		load[qs[0]] += rootCost(j)
	}
	for _, j := range r.jobs {
		j.own = j.parts[rank]
	}
	r.comm = c
	return nil
}

// rootCost is the work of refreshing job j, counted as the cube of each
// statistic's order times the matrices stacked (an eigendecomposition's
// or Newton iteration's flops are a multiple of it).
func rootCost(j *rootJob) float64 {
	c := 0.0
	for _, t := range j.src {
		d := float64(t.Shape[len(t.Shape)-1])
		m := 1.0
		for _, x := range t.Shape[:len(t.Shape)-2] {
			m *= float64(x)
		}
		c += m * d * d * d
	}
	return c
}

// add registers a job. With Async, snapshots of src (state, named
// <name>.snap<i>: checkpointed so that a resumed run recomputes a refresh
// that was in flight) and pending copies of dst (work) are allocated.
func (r *rootSched) add(s *state, a device.Allocator, prefix string, j *rootJob, status *tensor.Tensor) error {
	j.own = all
	var err error
	if j.status, err = s.zeros(a, prefix, j.name+".status", status.DType, status.Shape...); err != nil {
		return err
	}
	if j.f64s, err = s.zeros(a, prefix, j.name+".f64", tensor.I32, 1); err != nil {
		return err
	}
	if r.opts.Async {
		for i, t := range j.src {
			snap, err := s.zeros(a, prefix, fmt.Sprintf("%s.snap%d", j.name, i), t.DType, t.Shape...)
			if err != nil {
				return err
			}
			j.snap = append(j.snap, snap)
		}
		for i, t := range j.dst {
			p, err := s.work(a, prefix, fmt.Sprintf("%s.pending%d", j.name, i), t.DType, t.Shape...)
			if err != nil {
				return err
			}
			b, err := t.Read()
			if err != nil {
				return err
			}
			if err := p.Write(b); err != nil { // failed matrices keep what dst held
				return err
			}
			j.pend = append(j.pend, p)
		}
	}
	r.jobs = append(r.jobs, j)
	return nil
}

// publishDue reports whether step t puts the asynchronous refresh in
// flight in use (its staleness bound reached).
func (r *rootSched) publishDue(t int) bool {
	return r.pendingT > 0 && t >= r.pendingT+r.opts.MaxStaleness
}

// due reports whether step t starts a refresh.
func (r *rootSched) due(t int) bool { return t >= r.start && (t-r.start)%r.every == 0 }

// ready reports whether preconditioners are in use at step t (the first
// refresh has been put in use).
func (r *rootSched) ready(t int) bool {
	lag := 0
	if r.opts.Async {
		lag = r.opts.MaxStaleness
	}
	return t >= r.start+lag
}

// step runs the schedule at step t, after the statistics of step t are
// updated and before the preconditioners are read: it puts a finished
// asynchronous refresh in use when its time has come, and starts a
// refresh when one is due.
func (r *rootSched) step(e *ops.Engine, t int) error {
	if !r.resumed {
		r.resumed = true
		if err := r.resume(e, t); err != nil {
			return err
		}
	}
	if r.publishDue(t) {
		if err := r.publish(e); err != nil {
			return err
		}
	}
	if !r.due(t) {
		return nil
	}
	t0 := time.Now()
	if err := r.retry(e, t); err != nil {
		return err
	}
	if err := r.checkFailures(e, t); err != nil {
		return err
	}
	t1 := time.Now()
	r.stats.CheckMS += msSince(t0, t1)
	defer func() { r.stats.QueueMS += msSince(t1, time.Now()) }()
	r.stats.Refreshes++
	first := t == r.start
	if !r.opts.Async {
		for _, j := range r.jobs {
			if j.own.empty() {
				continue
			}
			r.stats.Blocks += j.own.blocks(j)
			st, err := j.run(e, j.src, j.dst, j.own, j.inF64(), first)
			if err != nil {
				return err
			}
			if err := r.copyStatus(e, j, j.own, st); err != nil {
				return err
			}
		}
		if err := r.exchange(e, func(j *rootJob) []*tensor.Tensor { return j.dst }); err != nil {
			return err
		}
		for _, j := range r.jobs {
			if err := r.recordStatus(e, j); err != nil {
				return err
			}
			if first {
				if err := r.verifyFirst(e, j, j.src, j.dst); err != nil {
					return err
				}
			}
		}
		if r.use != nil {
			return r.use(e, t)
		}
		return nil
	}
	for _, j := range r.jobs {
		for i := range j.src {
			if err := e.Copy(j.snap[i], j.src[i]); err != nil {
				return err
			}
		}
		// The refresh starts from the results in use (the same values
		// unless the state was just loaded: a resumed run).
		for i := range j.dst {
			if err := e.Copy(j.pend[i], j.dst[i]); err != nil {
				return err
			}
		}
	}
	if err := r.timeRefresh(e); err != nil {
		return err
	}
	err := e.Side(func() error {
		if r.sideA != nil {
			if err := r.sideA.Record(); err != nil {
				return err
			}
		}
		for _, j := range r.jobs {
			if j.own.empty() {
				continue
			}
			r.stats.Blocks += j.own.blocks(j)
			if err := r.sideRefresh(e, j, first); err != nil {
				return err
			}
		}
		return r.done.Record()
	})
	if err != nil {
		return err
	}
	r.refreshTiming = r.sideA != nil
	r.pendingT = t
	if r.opts.MaxStaleness == 0 {
		return r.publish(e)
	}
	return nil
}

// timeRefresh makes the events of an asynchronous refresh (done; on a GPU
// sideA, which times it) and adds the last refresh's GPU time, long since
// finished (it was put in use), to the stats.
func (r *rootSched) timeRefresh(e *ops.Engine) error {
	if r.done == nil {
		timing := e.IsGraphCapable()
		var err error
		if r.done, err = e.NewEvent(timing); err != nil {
			return err
		}
		if timing {
			if r.sideA, err = e.NewEvent(true); err != nil {
				return err
			}
		}
	}
	if !r.refreshTiming {
		return nil
	}
	r.refreshTiming = false
	ms, err := waitElapsed(r.sideA, r.done)
	if err != nil {
		return err
	}
	r.stats.RefreshesTimed++
	r.stats.RefreshMS += ms
	return nil
}

// waitElapsed waits on the host for end and returns the milliseconds from
// start's record to end's (timing events of one stream).
func waitElapsed(start, end *exec.Event) (float64, error) {
	if err := end.Wait(); err != nil {
		return 0, err
	}
	ms, err := end.Elapsed(start)
	return float64(ms), err
}

// exchange gives every rank the parts of a shared refresh the other ranks
// computed: for each job, each rank's part of its results (dsts: dst, or
// the pending copies) and of its status, broadcast from that rank, all in
// one group on the engine's stream (the main stream, so the exchange is
// ordered with the step's gradient all-reduces on the same communicator:
// NCCL wants one order of a communicator's collectives on every rank, and
// two streams would let a refresh's broadcast wait on one rank behind its
// peer's all-reduce). Nothing when the refreshes are not shared.
func (r *rootSched) exchange(e *ops.Engine, dsts func(j *rootJob) []*tensor.Tensor) error {
	if r.comm == nil {
		return nil
	}
	return r.comm.Group(e, func() error {
		for _, j := range r.jobs {
			for q, p := range j.parts {
				if p.empty() {
					continue
				}
				ts := dsts(j)
				for _, t := range append(ts[:len(ts):len(ts)], j.status) {
					v, err := p.of(t)
					if err != nil {
						return err
					}
					if err := r.comm.Broadcast(e, v, nil, q); err != nil {
						return fmt.Errorf("optim: %s: sharing rank %d's refresh: %w", j.name, q, err)
					}
				}
			}
		}
		return nil
	})
}

// sideRefresh queues job j's asynchronous refresh; inside Side. The
// refresh's work is a fixed sequence on fixed tensors for a given
// precision, so after one eager run it is captured once as a graph (on the
// side stream) and replayed: the host's cost of a refresh becomes one
// launch instead of the jobs' hundreds of queued ops and library calls (a
// GPU machine, 2026-11-28: 160–180 ms of host time per refresh of the
// shakespeare-char GPT's Shampoo and SOAP, the main stream idle behind
// it). Work that cannot be captured stays eager; so does a refresh queued
// while the engine is itself being captured (no nested capture), or on
// another engine than the graphs'. On the host the "graph" is the function
// itself (exec.Capture), so the host tests run this path too.
func (r *rootSched) sideRefresh(e *ops.Engine, j *rootJob, first bool) error {
	k := 0
	if j.inF64() {
		k = 1
	}
	run := func() error {
		st, err := j.run(e, j.snap, j.pend, j.own, j.inF64(), first)
		if err != nil {
			return err
		}
		return r.copyStatus(e, j, j.own, st)
	}
	mine := r.graphE == nil || r.graphE == e // no graphs yet, or this engine's
	var g *exec.CapturedGraph
	if mine {
		g = j.graphs[k]
	}
	if g == nil && mine && !first && j.warm[k] && !j.eager[k] {
		capturing, err := e.Capturing()
		if err != nil {
			return err
		}
		if !capturing {
			if g, err = e.Capture(run); err != nil {
				g = nil
				r.stats.Uncaptured++
				j.eager[k] = true
			} else {
				j.graphs[k], r.graphE = g, e
			}
		}
	}
	if g != nil {
		if err := g.Launch(); err != nil {
			return err
		}
		r.stats.Replayed++
	} else {
		if !first {
			j.warm[k] = true
		}
		if err := run(); err != nil {
			return err
		}
	}
	if r.comm != nil {
		return nil // recorded after the exchange (publish)
	}
	return r.recordStatus(e, j)
}

// msSince is b − a in milliseconds.
func msSince(a, b time.Time) float64 { return float64(b.Sub(a).Microseconds()) / 1e3 }

// publish makes the main stream wait for the side stream's refresh and
// copies its results into use (the first refresh's verified first).
func (r *rootSched) publish(e *ops.Engine) error {
	err := r.timeWait(e, func() error {
		if r.comm == nil {
			return nil
		}
		if err := r.exchange(e, func(j *rootJob) []*tensor.Tensor { return j.pend }); err != nil {
			return err
		}
		for _, j := range r.jobs {
			if err := r.recordStatus(e, j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r.pendingT == r.start {
		for _, j := range r.jobs {
			if err := r.verifyFirst(e, j, j.snap, j.pend); err != nil {
				return err
			}
		}
	}
	for _, j := range r.jobs {
		for i := range j.dst {
			if err := e.Copy(j.dst[i], j.pend[i]); err != nil {
				return err
			}
		}
	}
	t := r.pendingT
	r.pendingT = 0
	if r.use != nil {
		return r.use(e, t)
	}
	return nil
}

// timeWait makes the main stream wait for the side stream's refresh and
// then queues after (a shared refresh's exchange), between two timing
// events (on a GPU): the wait timed is the main stream's for this rank's
// refresh and, shared, for every rank's part of it. It adds the previous
// publish's wait, long since timed, to the stats.
func (r *rootSched) timeWait(e *ops.Engine, after func() error) error {
	if !e.IsGraphCapable() { // the host: side work has run
		if err := e.WaitEvent(r.done); err != nil {
			return err
		}
		return after()
	}
	if r.waitA == nil {
		var err error
		if r.waitA, err = e.NewEvent(true); err != nil {
			return err
		}
		if r.waitB, err = e.NewEvent(true); err != nil {
			return err
		}
	}
	if r.timing {
		ms, err := waitElapsed(r.waitA, r.waitB)
		if err != nil {
			return err
		}
		r.stats.Timed++
		r.stats.WaitMS += ms
		if ms > waitThreshold {
			r.stats.Waited++
		}
	}
	if err := r.waitA.Record(); err != nil {
		return err
	}
	if err := e.WaitEvent(r.done); err != nil {
		return err
	}
	if err := after(); err != nil {
		return err
	}
	r.timing = true
	return r.waitB.Record()
}

// resume reads, at the first step after construction (a fresh start or a
// checkpoint load), which jobs run in float64, and recomputes an
// asynchronous refresh that was in flight at step t−1: from its snapshot,
// synchronously, giving the same values the side stream would have.
func (r *rootSched) resume(e *ops.Engine, t int) error {
	if err := e.Sync(); err != nil {
		return err
	}
	for _, j := range r.jobs {
		b, err := j.f64s.Read()
		if err != nil {
			return err
		}
		j.f64At = int(tensor.BytesAs[int32](b)[0])
	}
	if !r.opts.Async || r.opts.MaxStaleness == 0 || t <= r.start {
		return nil
	}
	last := t - 1 - (t-1-r.start)%r.every // the last refresh before t
	if last < r.start || t > last+r.opts.MaxStaleness {
		return nil
	}
	for _, j := range r.jobs {
		// The refresh starts from the results in use before it (the
		// state's), as the side stream's did.
		for i := range j.dst {
			if err := e.Copy(j.pend[i], j.dst[i]); err != nil {
				return err
			}
		}
		st, err := j.run(e, j.snap, j.pend, all, j.inF64(), last == r.start)
		if err != nil {
			return fmt.Errorf("resuming: %w", err)
		}
		if err := r.stageStatus(e, j, st); err != nil {
			return err
		}
	}
	if err := r.timeRefresh(e); err != nil {
		return err
	}
	r.pendingT = last
	return r.done.Record()
}

// stageStatus copies a whole job's status into its state and stages it
// (recordStatus), on the stream that computed it.
func (r *rootSched) stageStatus(e *ops.Engine, j *rootJob, st *tensor.Tensor) error {
	if err := r.copyStatus(e, j, all, st); err != nil {
		return err
	}
	return r.recordStatus(e, j)
}

// copyStatus copies the status st of part of job j into that part of its
// state.
func (r *rootSched) copyStatus(e *ops.Engine, j *rootJob, part span, st *tensor.Tensor) error {
	dst, err := part.of(j.status)
	if err != nil {
		return err
	}
	return e.Copy(dst, st)
}

// recordStatus queues a copy of j's status (state) to the host (pinned
// staging memory on a GPU) and records j's event behind it.
func (r *rootSched) recordStatus(e *ops.Engine, j *rootJob) error {
	if j.stage == nil {
		var err error
		if j.stage, err = e.NewStaging(j.status.Bytes()); err != nil {
			return err
		}
	}
	if err := e.CopyOut(j.stage, 0, j.status); err != nil {
		return err
	}
	if j.ev == nil {
		var err error
		if j.ev, err = e.NewEvent(false); err != nil {
			return err
		}
	}
	return j.ev.Record()
}

// failures counts the failed matrices of a job's staged status: from its
// host copy, once the job's event says the copy has run (normally long
// since: a refresh interval ago), so the host waits for that copy alone;
// a status staged by another process (a resumed run) is read from the
// state, which waits for the whole device (tensor.Read).
func (r *rootSched) failures(j *rootJob) (int, error) {
	var b []byte
	if j.ev != nil && j.stage != nil {
		if err := j.ev.Wait(); err != nil {
			return 0, err
		}
		b = j.stage.Bytes()
	} else {
		var err error
		if b, err = j.status.Read(); err != nil {
			return 0, err
		}
	}
	failed := 0
	switch j.status.DType {
	case tensor.F32:
		for _, v := range tensor.BytesAs[float32](b) {
			if !(v < 1) || math.IsNaN(float64(v)) {
				failed++
			}
		}
	case tensor.I32:
		for _, v := range tensor.BytesAs[int32](b) {
			if v != 0 {
				failed++
			}
		}
	}
	return failed, nil
}

// verifyFirst checks a job's first refresh (computed from src into dst)
// before its results are used: the host waits for its status, and a job
// with failed matrices — which would keep dst's starting identities — is
// switched to float64 eigendecomposition and recomputed at once, on the
// main stream (the switch recorded in its state, as checkFailures does).
// Matrices that fail in float64 too keep the identity; both counts go to
// RootStats.Failures.
func (r *rootSched) verifyFirst(e *ops.Engine, j *rootJob, src, dst []*tensor.Tensor) error {
	if j.inF64() {
		return nil
	}
	failed, err := r.failures(j)
	if err != nil || failed == 0 {
		return err
	}
	r.stats.Failures += failed
	if err := r.toF64(e, j, r.start); err != nil {
		return err
	}
	st, err := j.run(e, src, dst, all, true, true)
	if err != nil {
		return fmt.Errorf("float64 retry: %w", err)
	}
	if err := r.stageStatus(e, j, st); err != nil {
		return err
	}
	failed, err = r.failures(j)
	r.stats.Failures += failed
	return err
}

// toF64 switches job j to float64 eigendecomposition at the refresh of
// step t, recording the switch (and t) in its state.
func (r *rootSched) toF64(e *ops.Engine, j *rootJob, t int) error {
	j.f64At = t
	r.stats.F64++
	return e.Fill(j.f64s, float64(t))
}

// retry returns the jobs that have run in float64 for f64Hold refreshes
// to their own method at the refresh of step t (see f64Hold); their
// status is read at the next refresh as any other's.
func (r *rootSched) retry(e *ops.Engine, t int) error {
	for _, j := range r.jobs {
		if !j.inF64() || t-j.f64At < f64Hold*r.every {
			continue
		}
		j.f64At = 0
		r.stats.Retried++
		if err := e.Fill(j.f64s, 0); err != nil {
			return err
		}
	}
	return nil
}

// checkFailures reads the last refresh's statuses (waiting, on a GPU, for
// that refresh's status copy to the host, which a refresh interval has
// normally long completed: no device-wide synchronisation, so the host
// keeps queueing the step ahead of the device) and switches jobs with
// failed matrices to float64 eigendecomposition at step t's refresh,
// recording the switch in their state.
func (r *rootSched) checkFailures(e *ops.Engine, t int) error {
	for _, j := range r.jobs {
		if j.inF64() {
			continue
		}
		failed, err := r.failures(j)
		if err != nil {
			return err
		}
		r.stats.Failures += failed
		if failed > 0 {
			if err := r.toF64(e, j, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// close waits for side work and frees the staging memory and events.
func (r *rootSched) close(e *ops.Engine) error {
	var errs []error
	if e != nil {
		errs = append(errs, e.Join(), e.Sync())
	}
	for _, j := range r.jobs {
		for k, g := range j.graphs {
			if g != nil {
				errs = append(errs, g.Close())
				j.graphs[k] = nil
			}
		}
		if j.ev != nil {
			errs = append(errs, j.ev.Close())
			j.ev = nil
		}
		if j.stage != nil {
			errs = append(errs, j.stage.Close())
			j.stage = nil
		}
	}
	if r.done != nil {
		errs = append(errs, r.done.Close())
		r.done = nil
	}
	for _, ev := range []**exec.Event{&r.waitA, &r.waitB, &r.sideA} {
		if *ev != nil {
			errs = append(errs, (*ev).Close())
			*ev = nil
		}
	}
	r.timing, r.refreshTiming, r.graphE = false, false, nil
	return errors.Join(errs...)
}

// validate checks the options against the refresh interval.
func (o RootOptions) validate(every int) error {
	if o.Method != ops.RootEigen && o.Method != ops.RootNewton {
		return fmt.Errorf("%w: root method %v", ErrConfig, o.Method)
	}
	if o.NewtonIters < 0 || o.NewtonIters > 1000 {
		return fmt.Errorf("%w: Newton iterations %d", ErrConfig, o.NewtonIters)
	}
	if o.MaxStaleness < 0 || o.MaxStaleness > every || (!o.Async && o.MaxStaleness != 0) {
		return fmt.Errorf("%w: max staleness %d (want 0 to the update frequency %d, and only with async roots)", ErrConfig, o.MaxStaleness, every)
	}
	return nil
}

// rooted is what Shampoo, SOAP and K-FAC share: their state, the step
// counter and the schedule of their preconditioners' refreshes, and the
// engine of the last Step (Free waits for its side stream). It supplies
// their Reset, Free, Steps, Counter, RootStats and Capturable.
type rooted struct {
	s     state
	step  counter
	sched rootSched
	e     *ops.Engine
}

// newRooted is a rooted before its first step (Steps −1) on schedule sched.
func newRooted(sched rootSched) rooted { return rooted{step: counter{t: -1}, sched: sched} }

// Steps implements Stepper (−1 before the first step after construction).
func (r *rooted) Steps() int { return r.step.t }

// Counter is the device's step counter ([1] i32).
func (r *rooted) Counter() *tensor.Tensor { return r.step.dev }

// RootStats says what the preconditioners' refreshes did.
func (r *rooted) RootStats() RootStats { return r.sched.stats }

// nextPhase is Phaser.NextPhase for an optimizer whose Step queues the
// same work at every step but those where the schedule acts (a refresh
// starts, or one is put in use), given whether preconditioners are in use:
// −1 at those steps and before the host knows the step count, else 1 when
// the preconditioners are in use and 0 before.
func (r *rooted) nextPhase() int {
	if r.step.t < 0 || !r.sched.resumed {
		return -1
	}
	n := r.step.t + 1
	if r.sched.due(n) || r.sched.publishDue(n) {
		return -1
	}
	if r.sched.ready(n) {
		return 1
	}
	return 0
}

// replayed advances the step count past a replayed step.
func (r *rooted) replayed() { r.step.t++ }

// Capturable implements Capturer: false (the refresh schedule is the
// host's).
func (r *rooted) Capturable() bool { return false }

// Reset implements Optimizer: side work waited for, state zeroed, every
// job's results (and pending results) back to identities, the schedule
// restarted.
func (r *rooted) Reset(e *ops.Engine) error {
	if err := r.sched.close(r.e); err != nil {
		return err
	}
	if err := r.s.reset(e); err != nil {
		return err
	}
	if err := e.Sync(); err != nil {
		return err
	}
	for _, j := range r.sched.jobs {
		for _, t := range append(append([]*tensor.Tensor(nil), j.dst...), j.pend...) {
			if err := identity(t); err != nil {
				return err
			}
		}
	}
	r.step.t = 0
	r.sched.pendingT, r.sched.resumed = 0, true
	return nil
}

// Free implements Optimizer (after waiting for side-stream work).
func (r *rooted) Free() error {
	err := r.sched.close(r.e)
	if e := r.s.free(); err == nil {
		err = e
	}
	return err
}
