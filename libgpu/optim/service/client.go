package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// Client is a connection to an optimizer service (`optimizer serve`).
type Client struct {
	path  string
	rpc   *ipc.Client
	hello HelloReply
}

// Dial connects to the service at path and says hello. An absent or dead
// socket gives an error that names the path and how to start a service;
// a peer that is not an optimizer service gives ErrProtocol.
func Dial(path string) (*Client, error) {
	conn, err := ipc.Dial(path)
	if err != nil {
		return nil, fmt.Errorf("%w: no optimizer service at %s: %v (start one with: optimizer serve --socket %s --pool POOL)", ErrGone, path, err, path)
	}
	c := &Client{path: path, rpc: ipc.NewClient(conn)}
	if _, err := c.rpc.Call(context.Background(), OpHello, HelloRequest{Client: filepath.Base(os.Args[0])}, &c.hello); err != nil {
		c.rpc.Close()
		return nil, c.wrap(OpHello, err)
	}
	if c.hello.Server != "optimizer" {
		c.rpc.Close()
		return nil, fmt.Errorf("%w: %s answers as %q, not an optimizer service", ErrProtocol, path, c.hello.Server)
	}
	return c, nil
}

// Hello is what the service said about itself.
func (c *Client) Hello() HelloReply { return c.hello }

// Close ends the connection: the service releases the run registered on
// it.
func (c *Client) Close() error { return c.rpc.Close() }

func (c *Client) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ipc.ErrClosed) {
		return fmt.Errorf("%w: %s to %s: the connection ended (%v)", ErrGone, op, c.path, err)
	}
	return err
}

// Buffers says in which named buffer a tensor lives (NameBook).
type Buffers interface {
	BufferOf(t *tensor.Tensor) (name string, ok bool)
}

// NameBook is a device.Allocator that remembers the name it allocated
// each buffer under, so a client can name its tensors to the service.
// Allocate the model's parameters, gradients (and K-FAC's activations)
// through a NameBook over a pool client.
type NameBook struct {
	device.Allocator
	mu    sync.Mutex
	names map[*device.Buffer]string
}

// NewNameBook wraps a.
func NewNameBook(a device.Allocator) *NameBook {
	return &NameBook{Allocator: a, names: map[*device.Buffer]string{}}
}

// Alloc implements device.Allocator and records the name.
func (b *NameBook) Alloc(name string, size int64) (*device.Buffer, error) {
	buf, err := b.Allocator.Alloc(name, size)
	if err == nil && name != "" {
		b.mu.Lock()
		b.names[buf] = name
		b.mu.Unlock()
	}
	return buf, err
}

// BufferOf implements Buffers.
func (b *NameBook) BufferOf(t *tensor.Tensor) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, ok := b.names[t.Buf]
	return n, ok
}

// Opener maps named buffers and makes new connections to its pool for
// the service to act as this process (a *pool.Client).
type Opener interface {
	Open(name string) (*device.Buffer, error)
	// Handover returns a new, unused connection to the pool (see
	// pool.Client.Handover); register sends it to the service.
	Handover() (*os.File, error)
}

// Registration describes a run to the service.
type Registration struct {
	Run    string
	Spec   optim.Spec
	Params []nn.Param
	// Layers are K-FAC's linear layers, with their Input and OutGrad
	// buffers (the service cannot hook the client's graph).
	Layers []optim.KFACLayer
	// Buffers names the buffers of Params and Layers' tensors.
	Buffers Buffers
	// Mem maps the optimizer's state for State (checkpoints) and hands
	// the service the pool connection it acts through: the client's pool
	// connection.
	Mem Opener
	// LRScale, when set, is an f32 scalar in a named buffer that the
	// optimizer multiplies its learning rate by (see RegisterRequest);
	// Remote.LRScaled says whether it does.
	LRScale *tensor.Tensor
}

// Register builds the run's optimizer in the service, over the client's
// buffers, and returns it as an optim.Optimizer whose Step sends one
// message. e is the engine the client steps on (its stream records the
// client's event and waits for the service's). Tensors must be contiguous.
func (c *Client) Register(e *ops.Engine, r Registration) (_ *Remote, err error) {
	name := func(what string, t *tensor.Tensor) (TensorRef, error) {
		if t == nil || !t.Contiguous() {
			return TensorRef{}, fmt.Errorf("%w: %s is missing or not contiguous", ErrTensor, what)
		}
		b, ok := r.Buffers.BufferOf(t)
		if !ok {
			return TensorRef{}, fmt.Errorf("%w: %s is not in a named buffer (allocate it through a NameBook)", ErrTensor, what)
		}
		return Ref(b, t), nil
	}
	req := RegisterRequest{Run: r.Run, Spec: r.Spec}
	for _, p := range r.Params {
		v, err := name(p.Name, p.Value)
		if err != nil {
			return nil, err
		}
		g, err := name(p.Name+"'s gradient", p.Grad)
		if err != nil {
			return nil, err
		}
		req.Params = append(req.Params, ParamRef{Name: p.Name, Value: v, Grad: g})
	}
	for _, l := range r.Layers {
		lr := LayerRef{Weight: l.Weight, Bias: l.Bias}
		if l.Input != nil {
			in, err := name(l.Weight+"'s input", l.Input)
			if err != nil {
				return nil, err
			}
			lr.Input = &in
		}
		if l.OutGrad != nil {
			og, err := name(l.Weight+"'s output gradient", l.OutGrad)
			if err != nil {
				return nil, err
			}
			lr.OutGrad = &og
		}
		req.Layers = append(req.Layers, lr)
	}
	if r.LRScale != nil {
		sc, err := name("the learning-rate scale", r.LRScale)
		if err != nil {
			return nil, err
		}
		req.LRScale = &sc
	}
	rm := &Remote{c: c, e: e}
	defer func() {
		if err != nil {
			rm.free(false)
		}
	}()
	if rm.own, req.Event, err = NewEvent(e); err != nil {
		return nil, err
	}
	// The service acts on the pool through a connection of ours, with our
	// uid's rights (PROTOCOL.md, "Trust").
	conn, err := r.Mem.Handover()
	if err != nil {
		return nil, fmt.Errorf("optimizer: a pool connection for the service: %w", err)
	}
	var reply RegisterReply
	_, err = c.rpc.Call(context.Background(), OpRegister, req, &reply, int(conn.Fd()))
	conn.Close()
	if err != nil {
		return nil, c.wrap(OpRegister, err)
	}
	rm.lrScaled = reply.LRScale
	if rm.peer, err = OpenEvent(e, reply.Event); err != nil {
		return nil, err
	}
	if e.Stream() != 0 && rm.peer == nil {
		return nil, fmt.Errorf("%w: a CUDA service sent no event", ErrProtocol)
	}
	for _, s := range reply.State {
		shape, off, n, err := s.Tensor.Check("state " + s.Name)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		dt, _ := tensor.ParseDType(s.Tensor.DType)
		b, err := r.Mem.Open(s.Tensor.Buffer)
		if err != nil {
			return nil, fmt.Errorf("optimizer: mapping state %q: %w", s.Name, err)
		}
		rm.bufs = append(rm.bufs, b)
		if off > b.Size() || n > b.Size()-off {
			return nil, fmt.Errorf("%w: state %q does not fit its buffer", ErrProtocol, s.Name)
		}
		t := &tensor.Tensor{Buf: b, DType: dt, Shape: shape, Strides: tensor.RowMajor(shape), Offset: int(s.Tensor.Offset)}
		rm.state = append(rm.state, nn.Param{Name: s.Name, Value: t})
		if s.Name == "step" {
			rm.counter = t
		}
	}
	return rm, nil
}

// Remote is a run's optimizer in the service (optim.Optimizer): Step
// records the client's event on its engine's stream, sends one message and
// makes the stream wait for the service's event, so the host waits only
// for the reply (the service queues the step and answers), never for the
// GPU. State maps the service's state buffers for checkpoints: written
// into before the first step, they resume the run exactly.
type Remote struct {
	c         *Client
	e         *ops.Engine
	own, peer *Event
	state     []nn.Param
	bufs      []*device.Buffer
	counter   *tensor.Tensor
	lr        float32
	steps     int
	lrScaled  bool
}

// LRScaled says whether the service's optimizer reads the registration's
// LRScale (then SetLR is not needed for a schedule).
func (r *Remote) LRScaled() bool { return r.lrScaled }

// Step implements optim.Optimizer.
func (r *Remote) Step(e *ops.Engine) error {
	if err := r.own.Record(e); err != nil {
		return err
	}
	var reply StepReply
	if _, err := r.c.rpc.Call(context.Background(), OpStep, StepRequest{LR: r.lr}, &reply); err != nil {
		return r.c.wrap(OpStep, err)
	}
	r.lr, r.steps = 0, reply.Step
	return r.peer.Wait(e)
}

// State implements optim.Optimizer: the service's state, mapped here.
func (r *Remote) State() []nn.Param { return r.state }

// SetLR implements optim.Optimizer (sent with the next step).
func (r *Remote) SetLR(lr float32) { r.lr = lr }

// Reset implements optim.Optimizer.
func (r *Remote) Reset(e *ops.Engine) error {
	if err := r.own.Record(e); err != nil {
		return err
	}
	if _, err := r.c.rpc.Call(context.Background(), OpReset, nil, nil); err != nil {
		return r.c.wrap(OpReset, err)
	}
	return r.peer.Wait(e)
}

// Stats asks the service about the run.
func (r *Remote) Stats() (StatsReply, error) {
	var s StatsReply
	_, err := r.c.rpc.Call(context.Background(), OpStats, nil, &s)
	return s, r.c.wrap(OpStats, err)
}

// Steps is the step count the service reported with the last step.
func (r *Remote) Steps() int { return r.steps }

// Counter is the service's step counter ([1] i32 state), or nil.
func (r *Remote) Counter() *tensor.Tensor { return r.counter }

// Capturable implements optim.Capturer: false (a step is a message).
func (r *Remote) Capturable() bool { return false }

// Free implements optim.Optimizer: the run is closed in the service (its
// state freed there), the mappings and events here, and the Client's
// connection (one run per connection).
func (r *Remote) Free() error { return r.free(true) }

func (r *Remote) free(closeRun bool) error {
	var errs []error
	if closeRun {
		if _, err := r.c.rpc.Call(context.Background(), OpClose, nil, nil); err != nil && !errors.Is(err, ipc.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if r.e != nil {
		errs = append(errs, r.e.Sync(), r.own.Close(r.e), r.peer.Close(r.e))
	}
	r.own, r.peer = nil, nil
	for _, b := range r.bufs {
		errs = append(errs, b.Free())
	}
	r.bufs, r.state = nil, nil
	if closeRun {
		errs = append(errs, r.c.Close())
	}
	return errors.Join(errs...)
}

var (
	_ optim.Optimizer = (*Remote)(nil)
	_ optim.Capturer  = (*Remote)(nil)
)
