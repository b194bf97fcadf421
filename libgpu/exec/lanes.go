package exec

// Lanes: independent pieces of one op's work fanned out over several
// streams and joined back, for library calls that leave most of the GPU
// idle one at a time (cuSOLVER's geqrf and orgqr on one matrix of order
// 256–1024 occupy a few multiprocessors; SOAP's refresh makes 86 of them).
// The fan-out is a fork event on the current stream that every lane's
// stream waits for, and the join an event per lane that the current stream
// waits for, so inside a stream capture the lanes become parallel branches
// of the graph (CUDA Programming Guide, "Cross-stream Dependencies and
// Events" under stream capture), as Side's do.
//
// Each stream that fans out (the main, side, communication or a While body
// stream) has lanes of its own, so that one stream's lanes never queue
// behind another's work. A lane has its own cuSOLVER handle (bound to the
// lane's stream) and its own scratch namespace, and no cuBLASLt workspace:
// GEMMs are refused there (Workspace fails with ErrSide).

import (
	"fmt"

	"gpukit/libgpu/cuda"
)

// MaxLanes bounds Lanes' fan-out.
const MaxLanes = 16

// laneSet is the lanes of one origin stream, grown on demand.
type laneSet struct {
	fork    cuda.Event
	streams []cuda.Stream
	joins   []cuda.Event
	solvers []*cuda.SolverHandle
}

// laneState is the backend's lanes: per origin stream, and the lane being
// queued now (-1 outside Lanes).
type laneState struct {
	sets map[cuda.Stream]*laneSet
	cur  int
	set  *laneSet
}

// Lanes runs fn(0), …, fn(n−1) with the current stream replaced by lane
// i's stream (n ≤ MaxLanes; n < 1 is an error), each lane after
// everything queued so far on the current stream, and makes the current
// stream wait for all of them before it returns. fn must queue only work
// independent of the other lanes' (distinct outputs): library solver calls
// (Solver gives the lane's handle) and kernels; the cuBLASLt workspace is
// not available in a lane. A lane's Scratch names are its own. Nested
// Lanes is an error. Inside Do.
func (c *CUDA) Lanes(n int, fn func(lane int) error) error {
	if n < 1 || n > MaxLanes {
		return fmt.Errorf("exec: %d lanes (want 1 to %d)", n, MaxLanes)
	}
	if c.lanes.set != nil {
		return fmt.Errorf("exec: nested Lanes")
	}
	origin := c.stream
	set, err := c.laneSet(origin, n)
	if err != nil {
		return err
	}
	if err := set.fork.Record(origin); err != nil {
		return fmt.Errorf("exec: lanes fork: %w", err)
	}
	ws := c.ws
	c.ws, c.lanes.set = 0, set
	defer func() { c.stream, c.ws, c.lanes.set, c.lanes.cur = origin, ws, nil, -1 }()
	var first error
	for i := 0; i < n; i++ {
		s := set.streams[i]
		if err := s.WaitEvent(set.fork); err != nil {
			return fmt.Errorf("exec: lane %d fork: %w", i, err)
		}
		c.stream, c.lanes.cur = s, i
		if first == nil {
			first = fn(i)
		}
		// Join every forked lane even after an error: a capture must not
		// end with a lane stream left out of it.
		if err := set.joins[i].Record(s); err != nil && first == nil {
			first = fmt.Errorf("exec: lane %d join: %w", i, err)
		}
		if err := origin.WaitEvent(set.joins[i]); err != nil && first == nil {
			first = fmt.Errorf("exec: lane %d join: %w", i, err)
		}
	}
	return first
}

// laneSet returns origin's lanes, with at least n streams. Inside Do.
func (c *CUDA) laneSet(origin cuda.Stream, n int) (*laneSet, error) {
	if c.lanes.sets == nil {
		c.lanes.sets = map[cuda.Stream]*laneSet{}
	}
	set := c.lanes.sets[origin]
	if set == nil {
		ev, err := cuda.EventCreate(cuda.EventDisableTiming)
		if err != nil {
			return nil, fmt.Errorf("exec: lanes: %w", err)
		}
		set = &laneSet{fork: ev}
		c.lanes.sets[origin] = set
	}
	for len(set.streams) < n {
		s, err := cuda.StreamCreate(true)
		if err != nil {
			return nil, fmt.Errorf("exec: lane stream: %w", err)
		}
		set.streams = append(set.streams, s)
		ev, err := cuda.EventCreate(cuda.EventDisableTiming)
		if err != nil {
			return nil, fmt.Errorf("exec: lane event: %w", err)
		}
		set.joins = append(set.joins, ev)
		set.solvers = append(set.solvers, nil)
	}
	return set, nil
}

// laneSolver is the current lane's cuSOLVER handle, made on first use.
// Inside Do, inside Lanes.
func (c *CUDA) laneSolver() (*cuda.SolverHandle, error) {
	set, i := c.lanes.set, c.lanes.cur
	if set.solvers[i] == nil {
		h, err := cuda.SolverCreate()
		if err != nil {
			return nil, fmt.Errorf("exec: cuSOLVER for lane %d: %w", i, err)
		}
		set.solvers[i] = h
	}
	return set.solvers[i], nil
}

// lanesClose waits for every lane stream and frees the lanes. Inside Do,
// from close.
func (c *CUDA) lanesClose(keep func(error)) {
	for _, set := range c.lanes.sets {
		for i, s := range set.streams {
			keep(s.Synchronize())
			keep(s.Destroy())
			keep(set.joins[i].Destroy())
			if set.solvers[i] != nil {
				keep(set.solvers[i].Destroy())
			}
		}
		keep(set.fork.Destroy())
	}
	c.lanes = laneState{cur: -1}
}
