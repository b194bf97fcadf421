package exec

import (
	"errors"
	"fmt"

	"gpukit/libgpu/cuda"
)

// ErrCapture wraps failures to capture or replay a graph.
var ErrCapture = errors.New("exec: graph capture")

// CapturedGraph is a captured sequence of work: a CUDA graph on a GPU, the
// function itself on the host. Launch replays it; Close frees it.
type CapturedGraph struct {
	e     *Engine
	f     func() error
	graph cuda.Graph
	exec  cuda.GraphExec
}

// Capture records everything f queues on the engine (on the stream work is
// queued on now: inside Side, the side stream) into a graph without
// running it (CUDA stream capture in thread-local mode, on one pinned
// thread). The work must have run once eagerly with the same shapes first,
// so that scratch buffers, kernels and GEMM algorithms exist: allocation
// and compilation are not allowed while capturing. On the host, Capture
// keeps f and Launch calls it.
func (e *Engine) Capture(f func() error) (*CapturedGraph, error) {
	c := e.cuda
	if c == nil {
		return &CapturedGraph{e: e, f: f}, nil
	}
	g := &CapturedGraph{e: e}
	err := c.Do(func() error {
		if err := c.stream.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
			return err
		}
		ferr := f()
		graph, err := c.stream.EndCapture()
		if ferr != nil {
			if err == nil {
				graph.Destroy()
			}
			return ferr
		}
		if err != nil {
			return err
		}
		exec, err := graph.Instantiate()
		if err != nil {
			graph.Destroy()
			return err
		}
		g.graph, g.exec = graph, exec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCapture, err)
	}
	return g, nil
}

// Launch replays the graph on the stream work is queued on now: the
// engine's, or inside Side the side stream (queued; Sync or an event waits
// for it). A graph captured inside Side (its ops on the side stream, with
// its scratch and workspace) is replayed inside Side.
func (g *CapturedGraph) Launch() error {
	if g.exec == 0 {
		if g.f == nil {
			return fmt.Errorf("%w: graph closed", ErrCapture)
		}
		return g.f()
	}
	c := g.e.cuda
	return c.Do(func() error { return g.exec.Launch(c.stream) })
}

// Close frees the graph. Launch fails afterwards.
func (g *CapturedGraph) Close() error {
	g.f = nil
	if g.exec == 0 {
		return nil
	}
	err := g.e.cuda.Do(func() error {
		return errors.Join(g.exec.Destroy(), g.graph.Destroy())
	})
	g.exec, g.graph = 0, 0
	return err
}

// Capturing reports whether the stream work is queued on now (the main
// stream, or Side's inside Side) is being captured, by Capture or by a
// capture this one is part of; false on the host.
func (e *Engine) Capturing() (bool, error) {
	c := e.cuda
	if c == nil {
		return false, nil
	}
	var on bool
	err := c.Do(func() error {
		var err error
		on, err = c.stream.IsCapturing()
		return err
	})
	return on, err
}
