package optim

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/device"
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
	Failures  int // matrices whose root or decomposition failed (kept their previous value)
	F64       int // jobs switched to float64 eigendecomposition after a failure
}

// rootJob is one piece of preconditioner work: compute reads statistics
// src and writes results dst (roots, eigenbases), and returns a status
// tensor ([count] f32 residuals — a failure is a value not below 1 — or
// [count] i32 statuses — a failure is non-zero) that the scheduler reads
// back without waiting, to switch a failing job to float64.
type rootJob struct {
	name    string
	src     []*tensor.Tensor
	dst     []*tensor.Tensor
	compute func(e *ops.Engine, src, dst []*tensor.Tensor, f64 bool) (*tensor.Tensor, error)

	snap, pend []*tensor.Tensor // Async: state copies of src, work copies of dst
	f64        bool

	stage  *ops.Staging // the last status, copied back
	ev     *ops.Event   // recorded after that copy
	staged *tensor.Tensor
}

// rootSched runs an optimizer's rootJobs on a fixed schedule: at steps t ≥
// start with (t − start) % every = 0, synchronously, or asynchronously
// with results put in use at t + staleness.
type rootSched struct {
	opts         RootOptions
	start, every int
	jobs         []*rootJob
	done         *ops.Event // the side stream's last refresh
	pendingT     int        // the async refresh not yet in use (0: none)
	resumed      bool       // the first step after construction has run
	stats        RootStats
}

// add registers a job. With Async, snapshots of src (state, named
// <name>.snap<i>: checkpointed so that a resumed run recomputes a refresh
// that was in flight) and pending copies of dst (work) are allocated.
func (r *rootSched) add(s *state, a device.Allocator, prefix string, j *rootJob) error {
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
	if r.pendingT > 0 && t >= r.pendingT+r.opts.MaxStaleness {
		if err := r.publish(e); err != nil {
			return err
		}
	}
	if !r.due(t) {
		return nil
	}
	r.checkFailures()
	r.stats.Refreshes++
	if !r.opts.Async {
		for _, j := range r.jobs {
			st, err := j.compute(e, j.src, j.dst, j.f64)
			if err != nil {
				return fmt.Errorf("optim: %s: %w", j.name, err)
			}
			if err := r.stageStatus(e, j, st); err != nil {
				return err
			}
		}
		return nil
	}
	for _, j := range r.jobs {
		for i := range j.src {
			if err := e.Copy(j.snap[i], j.src[i]); err != nil {
				return err
			}
		}
	}
	if r.done == nil {
		var err error
		if r.done, err = e.NewEvent(false); err != nil {
			return err
		}
	}
	err := e.Side(func() error {
		for _, j := range r.jobs {
			st, err := j.compute(e, j.snap, j.pend, j.f64)
			if err != nil {
				return fmt.Errorf("optim: %s: %w", j.name, err)
			}
			if err := r.stageStatus(e, j, st); err != nil {
				return err
			}
		}
		return r.done.Record()
	})
	if err != nil {
		return err
	}
	r.pendingT = t
	if r.opts.MaxStaleness == 0 {
		return r.publish(e)
	}
	return nil
}

// publish makes the main stream wait for the side stream's refresh and
// copies its results into use.
func (r *rootSched) publish(e *ops.Engine) error {
	if err := e.WaitEvent(r.done); err != nil {
		return err
	}
	for _, j := range r.jobs {
		for i := range j.dst {
			if err := e.Copy(j.dst[i], j.pend[i]); err != nil {
				return err
			}
		}
	}
	r.pendingT = 0
	return nil
}

// resume recomputes, at the first step after construction (a fresh start
// or a checkpoint load), an asynchronous refresh that was in flight at
// step t−1: from its snapshot, synchronously, giving the same values the
// side stream would have.
func (r *rootSched) resume(e *ops.Engine, t int) error {
	if !r.opts.Async || r.opts.MaxStaleness == 0 || t <= r.start {
		return nil
	}
	last := t - 1 - (t-1-r.start)%r.every // the last refresh before t
	if last < r.start || t > last+r.opts.MaxStaleness {
		return nil
	}
	for _, j := range r.jobs {
		if _, err := j.compute(e, j.snap, j.pend, j.f64); err != nil {
			return fmt.Errorf("optim: %s (resumed): %w", j.name, err)
		}
	}
	if r.done == nil {
		var err error
		if r.done, err = e.NewEvent(false); err != nil {
			return err
		}
	}
	r.pendingT = last
	return r.done.Record()
}

// stageStatus queues the copy of a job's status to host memory, on the
// stream that computed it, and an event behind it.
func (r *rootSched) stageStatus(e *ops.Engine, j *rootJob, st *tensor.Tensor) error {
	if st == nil {
		return nil
	}
	if j.stage == nil {
		var err error
		if j.stage, err = e.NewStaging(st.Bytes()); err != nil {
			return err
		}
		if j.ev, err = e.NewEvent(false); err != nil {
			return err
		}
	}
	if err := e.CopyOut(j.stage, 0, st); err != nil {
		return err
	}
	j.staged = st
	return j.ev.Record()
}

// checkFailures reads the statuses of the last refresh that have arrived
// (without waiting) and switches jobs with failed matrices to float64
// eigendecomposition.
func (r *rootSched) checkFailures() {
	for _, j := range r.jobs {
		if j.staged == nil {
			continue
		}
		if done, err := j.ev.Query(); err != nil || !done {
			continue
		}
		st := j.staged
		j.staged = nil
		b := j.stage.Bytes()[:st.Bytes()]
		failed := 0
		switch st.DType {
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
		r.stats.Failures += failed
		if failed > 0 && !j.f64 {
			j.f64 = true
			r.stats.F64++
		}
	}
}

// close waits for side work and frees the staging memory and events.
func (r *rootSched) close(e *ops.Engine) error {
	var errs []error
	if e != nil {
		errs = append(errs, e.Join(), e.Sync())
	}
	for _, j := range r.jobs {
		if j.stage != nil {
			errs = append(errs, j.stage.Close(), j.ev.Close())
			j.stage, j.ev = nil, nil
		}
	}
	if r.done != nil {
		errs = append(errs, r.done.Close())
		r.done = nil
	}
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
