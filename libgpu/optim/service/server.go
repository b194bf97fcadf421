package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// Memory is where the service maps a client's buffers by name and
// allocates the optimizer's state under the run's names: a *pool.Client
// (the daemon's memory is what both processes share).
type Memory interface {
	device.Allocator
	Open(name string) (*device.Buffer, error)
}

// Server serves the optimizer protocol (ipc.Handler): each connection
// registers one run, whose optimizer steps on an engine of its own (its
// own stream) over the client's parameter and gradient buffers, mapped
// from Mem by name. When a connection ends, for any reason, its run's
// optimizer, state and mappings are released.
type Server struct {
	Mem     Memory
	Pool    string      // the pool's socket path (reported by hello)
	Options ops.Options // of every run's engine (precision)
	Logf    func(format string, args ...any)

	mu   sync.Mutex
	runs map[string]bool
}

// Connect implements ipc.Handler.
func (s *Server) Connect(*ipc.Conn) (ipc.Session, error) { return &session{s: s}, nil }

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// session is one connection's run.
type session struct {
	s      *Server
	run    string
	e      *ops.Engine
	opt    optim.Optimizer
	opened map[string]*device.Buffer
	peer   *ipcEvent // the client's: its gradients are written
	own    *ipcEvent // ours: the step's updates are queued before it
}

// Handle implements ipc.Session.
func (ss *session) Handle(_ context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	switch m.Op {
	case OpHello:
		backend := "host"
		if ss.s.Mem.Device().Kind() == device.KindCUDA {
			backend = "cuda"
		}
		return HelloReply{Server: "optimizer", PID: os.Getpid(), Backend: backend, Pool: ss.s.Pool}, nil, nil
	case OpRegister:
		var req RegisterRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		r, err := ss.register(&req)
		return r, nil, err
	}
	if ss.opt == nil {
		if m.Op == OpStep || m.Op == OpReset || m.Op == OpStats || m.Op == OpClose {
			return nil, nil, ErrNotRegistered
		}
		return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
	}
	switch m.Op {
	case OpStep:
		var req StepRequest
		if err := ipc.UnmarshalBody(m.Body, &req); err != nil {
			return nil, nil, err
		}
		return ss.step(req)
	case OpReset:
		if err := ss.peer.wait(ss.e); err != nil {
			return nil, nil, err
		}
		if err := ss.opt.Reset(ss.e); err != nil {
			return nil, nil, err
		}
		return nil, nil, ss.own.record(ss.e)
	case OpStats:
		r := StatsReply{Steps: -1}
		if st, ok := ss.opt.(optim.Stepper); ok {
			r.Steps = st.Steps()
		}
		if rs, ok := ss.opt.(interface{ RootStats() optim.RootStats }); ok {
			x := rs.RootStats()
			r.Refreshes, r.Failures, r.F64 = x.Refreshes, x.Failures, x.F64
		}
		return r, nil, nil
	case OpClose:
		ss.release()
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
}

// step runs one step: the engine's stream waits for the client's
// gradients, the optimizer's work is queued, and the service's event is
// recorded behind it; the reply goes as soon as it is queued.
func (ss *session) step(req StepRequest) (any, []int, error) {
	if req.LR < 0 || req.LR != req.LR {
		return nil, nil, fmt.Errorf("%w: learning rate %v", ipc.ErrBadRequest, req.LR)
	}
	if req.LR > 0 {
		ss.opt.SetLR(req.LR)
	}
	if err := ss.peer.wait(ss.e); err != nil {
		return nil, nil, err
	}
	if err := ss.opt.Step(ss.e); err != nil {
		return nil, nil, err
	}
	if err := ss.own.record(ss.e); err != nil {
		return nil, nil, err
	}
	r := StepReply{Step: -1}
	if st, ok := ss.opt.(optim.Stepper); ok {
		r.Step = st.Steps()
	}
	return r, nil, nil
}

// open maps the buffer name (once per session).
func (ss *session) open(name string) (*device.Buffer, error) {
	if b, ok := ss.opened[name]; ok {
		return b, nil
	}
	b, err := ss.s.Mem.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%w: buffer %q: %w", ErrTensor, name, err)
	}
	ss.opened[name] = b
	return b, nil
}

// tensor is the tensor r names, checked against its buffer.
func (ss *session) tensor(r TensorRef) (*tensor.Tensor, error) {
	dt, err := tensor.ParseDType(r.DType)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrTensor, r.Buffer, err)
	}
	shape, err := r.shape()
	if err != nil {
		return nil, err
	}
	b, err := ss.open(r.Buffer)
	if err != nil {
		return nil, err
	}
	n := int64(tensor.Numel(shape))
	if r.Offset < 0 || (r.Offset+n)*int64(dt.Size()) > b.Size() {
		return nil, fmt.Errorf("%w: %v %v at element %d of %q (%d bytes)", ErrTensor, dt, shape, r.Offset, r.Buffer, b.Size())
	}
	t := &tensor.Tensor{Buf: b, DType: dt, Shape: shape, Strides: tensor.RowMajor(shape), Offset: int(r.Offset)}
	return t, nil
}

func (ss *session) register(req *RegisterRequest) (_ *RegisterReply, err error) {
	if ss.opt != nil {
		return nil, ErrRegistered
	}
	if req.Run == "" || len(req.Run) > 200 {
		return nil, fmt.Errorf("%w: run name %q", ipc.ErrBadRequest, req.Run)
	}
	s := ss.s
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[string]bool{}
	}
	if s.runs[req.Run] {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: run %q is registered by another connection", ipc.ErrBadRequest, req.Run)
	}
	s.runs[req.Run] = true
	s.mu.Unlock()
	ss.run = req.Run
	ss.opened = map[string]*device.Buffer{}
	defer func() {
		if err != nil {
			ss.release()
		}
	}()
	if ss.e, err = ops.NewEngine(s.Mem.Device(), s.Options); err != nil {
		return nil, err
	}
	var params []nn.Param
	for _, p := range req.Params {
		v, err := ss.tensor(p.Value)
		if err != nil {
			return nil, err
		}
		g, err := ss.tensor(p.Grad)
		if err != nil {
			return nil, err
		}
		params = append(params, nn.Param{Name: p.Name, Value: v, Grad: g})
	}
	var layers []optim.KFACLayer
	for _, l := range req.Layers {
		k := optim.KFACLayer{Weight: l.Weight, Bias: l.Bias}
		if l.Input != nil {
			if k.Input, err = ss.tensor(*l.Input); err != nil {
				return nil, err
			}
		}
		if l.OutGrad != nil {
			if k.OutGrad, err = ss.tensor(*l.OutGrad); err != nil {
				return nil, err
			}
		}
		if (k.Input == nil) != (k.OutGrad == nil) || k.Input == nil {
			return nil, fmt.Errorf("%w: K-FAC layer %q needs its input and output gradient buffers (the service has no hook)", ipc.ErrBadRequest, l.Weight)
		}
		layers = append(layers, k)
	}
	if ss.opt, err = optim.New(s.Mem, req.Run, params, layers, req.Spec); err != nil {
		return nil, err
	}
	reply := &RegisterReply{}
	if req.LRScale != nil {
		sc, err := ss.tensor(*req.LRScale)
		if err != nil {
			return nil, err
		}
		if sc.DType != tensor.F32 || sc.Numel() != 1 {
			return nil, fmt.Errorf("%w: the learning-rate scale is %v %v, want one f32", ErrTensor, sc.DType, sc.Shape)
		}
		if o, ok := ss.opt.(interface{ SetLRScale(*tensor.Tensor) }); ok {
			o.SetLRScale(sc)
			reply.LRScale = true
		}
	}
	if ss.peer, err = openIPCEvent(ss.e, req.Event); err != nil {
		return nil, err
	}
	if streamOf(ss.e) != 0 && ss.peer == nil {
		return nil, fmt.Errorf("%w: a CUDA client must send its event", ipc.ErrBadRequest)
	}
	if ss.own, reply.Event, err = newIPCEvent(ss.e); err != nil {
		return nil, err
	}
	for _, p := range ss.opt.State() {
		reply.State = append(reply.State, StateRef{Name: p.Name, Tensor: ref(optim.BufferName(req.Run, p.Name), p.Value)})
	}
	s.logf("optimizer: run %q: %s over %d parameters", req.Run, req.Spec.Name, len(params))
	return reply, nil
}

// release frees everything the session holds: the optimizer (waiting for
// its engine), its state, the events and the mappings.
func (ss *session) release() {
	var errs []error
	if ss.opt != nil {
		errs = append(errs, ss.opt.Free())
		ss.opt = nil
	}
	if ss.e != nil {
		errs = append(errs, ss.e.Sync(), ss.peer.close(ss.e), ss.own.close(ss.e))
		ss.peer, ss.own = nil, nil
		if c, ok := ss.e.Impl().(io.Closer); ok {
			errs = append(errs, c.Close())
		}
		ss.e = nil
	}
	for _, b := range ss.opened {
		errs = append(errs, b.Free())
	}
	ss.opened = nil
	if ss.run != "" {
		ss.s.mu.Lock()
		delete(ss.s.runs, ss.run)
		ss.s.mu.Unlock()
		if err := errors.Join(errs...); err != nil {
			ss.s.logf("optimizer: run %q released with errors: %v", ss.run, err)
		}
		ss.run = ""
	}
}

// Close implements ipc.Session: the connection ended.
func (ss *session) Close() { ss.release() }
