package cuda

import (
	"errors"
	"unsafe"
)

var (
	pStreamCreate       = newProc(libDriver, "cuStreamCreate")
	pStreamCreatePrio   = newProc(libDriver, "cuStreamCreateWithPriority")
	pCtxStreamPrios     = newProc(libDriver, "cuCtxGetStreamPriorityRange")
	pStreamGetPriority  = newProc(libDriver, "cuStreamGetPriority")
	pStreamSynchronize  = newProc(libDriver, "cuStreamSynchronize")
	pStreamDestroy      = newProc(libDriver, "cuStreamDestroy_v2")
	pStreamWaitEvent    = newProc(libDriver, "cuStreamWaitEvent")
	pStreamQuery        = newProc(libDriver, "cuStreamQuery")
	pStreamBeginCapture = newProc(libDriver, "cuStreamBeginCapture_v2")
	pStreamEndCapture   = newProc(libDriver, "cuStreamEndCapture")
	pStreamIsCapturing  = newProc(libDriver, "cuStreamIsCapturing")

	pEventCreate      = newProc(libDriver, "cuEventCreate")
	pEventRecord      = newProc(libDriver, "cuEventRecord")
	pEventSynchronize = newProc(libDriver, "cuEventSynchronize")
	pEventQuery       = newProc(libDriver, "cuEventQuery")
	pEventDestroy     = newProc(libDriver, "cuEventDestroy_v2")
	pEventElapsed     = newProc(libDriver, "cuEventElapsedTime_v2", "cuEventElapsedTime")

	pGraphInstantiate = newProc(libDriver, "cuGraphInstantiateWithFlags")
	pGraphDestroy     = newProc(libDriver, "cuGraphDestroy")
	pGraphLaunch      = newProc(libDriver, "cuGraphLaunch")
	pGraphExecUpdate  = newProc(libDriver, "cuGraphExecUpdate_v2")
	pGraphExecDestroy = newProc(libDriver, "cuGraphExecDestroy")
)

// Stream is a CUstream. The zero Stream is the legacy default stream, which
// synchronises with every blocking stream of the context.
type Stream uintptr

// StreamCreate creates a stream; nonBlocking (CU_STREAM_NON_BLOCKING) makes
// it not synchronise with the legacy default stream.
func StreamCreate(nonBlocking bool) (Stream, error) {
	var flags uintptr
	if nonBlocking {
		flags = 1
	}
	var s uintptr
	if err := pStreamCreate.cu(uintptr(unsafe.Pointer(&s)), flags); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamCreateWithPriority creates a stream of the given priority
// (cuStreamCreateWithPriority: lower numbers are higher priorities, within
// StreamPriorityRange; the block scheduler starts pending blocks of
// higher-priority streams first). nonBlocking as StreamCreate.
func StreamCreateWithPriority(nonBlocking bool, priority int) (Stream, error) {
	var flags uintptr
	if nonBlocking {
		flags = 1
	}
	var s uintptr
	if err := pStreamCreatePrio.cu(uintptr(unsafe.Pointer(&s)), flags, uintptr(int64(priority))); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// StreamPriorityRange is the current context's stream priorities
// (cuCtxGetStreamPriorityRange): least (the default, 0) and greatest
// (a negative number on GPUs with priorities, −5 on Hopper; 0 and 0
// without them).
func StreamPriorityRange() (least, greatest int, err error) {
	var l, g int32
	if err := pCtxStreamPrios.cu(uintptr(unsafe.Pointer(&l)), uintptr(unsafe.Pointer(&g))); err != nil {
		return 0, 0, err
	}
	return int(l), int(g), nil
}

// Priority is s's priority (cuStreamGetPriority).
func (s Stream) Priority() (int, error) {
	var p int32
	if err := pStreamGetPriority.cu(uintptr(s), uintptr(unsafe.Pointer(&p))); err != nil {
		return 0, err
	}
	return int(p), nil
}

// Synchronize waits until all work queued on s has finished.
func (s Stream) Synchronize() error { return pStreamSynchronize.cu(uintptr(s)) }

// Destroy destroys the stream (queued work still completes).
func (s Stream) Destroy() error { return pStreamDestroy.cu(uintptr(s)) }

// WaitEvent makes later work on s wait until the last Record of e (as of
// this call) has completed; e may come from another process
// (IpcOpenEventHandle). The host does not block.
func (s Stream) WaitEvent(e Event) error { return pStreamWaitEvent.cu(uintptr(s), uintptr(e), 0) }

// Query reports whether all work queued on s has finished.
func (s Stream) Query() (done bool, err error) { return ready(pStreamQuery.cu(uintptr(s))) }

// ready turns CUDA_ERROR_NOT_READY into (false, nil).
func ready(err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrorNotReady) {
		return false, nil
	}
	return false, err
}

// StreamCaptureMode is a CUstreamCaptureMode: which unsafe calls (such as
// synchronous allocation) other threads may make during a capture.
type StreamCaptureMode int

// Capture modes.
const (
	CaptureModeGlobal      StreamCaptureMode = 0
	CaptureModeThreadLocal StreamCaptureMode = 1
	CaptureModeRelaxed     StreamCaptureMode = 2
)

// BeginCapture starts recording the work queued on s (not the legacy
// default stream) into a graph instead of running it.
func (s Stream) BeginCapture(mode StreamCaptureMode) error {
	return pStreamBeginCapture.cu(uintptr(s), uintptr(mode))
}

// EndCapture ends the capture started by BeginCapture and returns the graph.
func (s Stream) EndCapture() (Graph, error) {
	var g uintptr
	if err := pStreamEndCapture.cu(uintptr(s), uintptr(unsafe.Pointer(&g))); err != nil {
		return 0, err
	}
	return Graph(g), nil
}

// IsCapturing reports whether s is capturing. An invalidated capture
// (CU_STREAM_CAPTURE_STATUS_INVALIDATED) is reported as an error wrapping
// ErrorStreamCaptureInvalidated.
func (s Stream) IsCapturing() (bool, error) {
	var st int32
	if err := pStreamIsCapturing.cu(uintptr(s), uintptr(unsafe.Pointer(&st))); err != nil {
		return false, err
	}
	switch st {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return true, &CallError{Func: "cuStreamIsCapturing", Err: ErrorStreamCaptureInvalidated}
}

// Event is a CUevent.
type Event uintptr

// EventFlags are CUevent_flags, combined with |.
type EventFlags uint32

// Event flags. An interprocess event (EventInterprocess) must also have
// EventDisableTiming: cuEventCreate rejects it otherwise.
const (
	EventDefault       EventFlags = 0
	EventBlockingSync  EventFlags = 1
	EventDisableTiming EventFlags = 2
	EventInterprocess  EventFlags = 4
)

// EventCreate creates an event in the current context.
func EventCreate(flags EventFlags) (Event, error) {
	if flags&EventInterprocess != 0 && flags&EventDisableTiming == 0 {
		return 0, badArg("EventInterprocess needs EventDisableTiming too")
	}
	var e uintptr
	if err := pEventCreate.cu(uintptr(unsafe.Pointer(&e)), uintptr(flags)); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// Record captures the work queued on s so far; the event completes when
// that work has.
func (e Event) Record(s Stream) error { return pEventRecord.cu(uintptr(e), uintptr(s)) }

// Synchronize blocks the host until the event has completed.
func (e Event) Synchronize() error { return pEventSynchronize.cu(uintptr(e)) }

// Query reports whether the event has completed.
func (e Event) Query() (bool, error) { return ready(pEventQuery.cu(uintptr(e))) }

// Destroy destroys the event.
func (e Event) Destroy() error { return pEventDestroy.cu(uintptr(e)) }

// EventElapsed returns the time in milliseconds between two completed events
// created without EventDisableTiming (resolution about 0.5 µs).
func EventElapsed(start, end Event) (ms float32, err error) {
	if err := pEventElapsed.cu(uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end)); err != nil {
		return 0, err
	}
	return ms, nil
}

// Graph is a CUgraph, e.g. from Stream.EndCapture.
type Graph uintptr

// Instantiate turns the graph into an executable graph
// (cuGraphInstantiateWithFlags, no flags).
func (g Graph) Instantiate() (GraphExec, error) {
	var x uintptr
	if err := pGraphInstantiate.cu(uintptr(unsafe.Pointer(&x)), uintptr(g), 0); err != nil {
		return 0, err
	}
	return GraphExec(x), nil
}

// Destroy destroys the graph (executable graphs made from it stay valid).
func (g Graph) Destroy() error { return pGraphDestroy.cu(uintptr(g)) }

// GraphExec is a CUgraphExec: an instantiated graph, launched as one unit.
type GraphExec uintptr

// Launch queues the whole graph on s.
func (x GraphExec) Launch(s Stream) error { return pGraphLaunch.cu(uintptr(x), uintptr(s)) }

// graphExecUpdateResultInfo mirrors CUgraphExecUpdateResultInfo (24 bytes):
// result (int32) at 0, errorNode at 8, errorFromNode at 16.
type graphExecUpdateResultInfo struct {
	Result        int32
	_             int32
	ErrorNode     uintptr
	ErrorFromNode uintptr
}

// Update replaces the parameters of x's nodes with those of g, which must
// have the same topology (cuGraphExecUpdate_v2); otherwise the error wraps
// ErrorGraphExecUpdateFailure and x must be instantiated again.
func (x GraphExec) Update(g Graph) error {
	var info graphExecUpdateResultInfo
	return pGraphExecUpdate.cu(uintptr(x), uintptr(g), uintptr(unsafe.Pointer(&info)))
}

// Destroy destroys the executable graph.
func (x GraphExec) Destroy() error { return pGraphExecDestroy.cu(uintptr(x)) }
