package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
)

// Memory is one run's view of the pool: the client's buffers by name and
// the optimizer's state, through the pool connection the client handed
// over with register, so the daemon checks every open and allocation as
// the client's (its uid's rights, also under gpupool --isolate, and its
// quota). A *pool.Client. Close ends the connection: the daemon takes
// back every lease the run held, at once.
type Memory interface {
	device.Allocator
	Open(name string) (*device.Buffer, error)
	// Remove unbinds a name (the memory stays while leased).
	Remove(name string) error
	Close() error
}

// Pools gives each run its Memory.
type Pools interface {
	// Device is where runs compute: the pool's device.
	Device() device.Device
	// Path names the pool (hello's pool).
	Path() string
	// Adopt makes the run's Memory of fd, the pool connection a client
	// (credentials client) sent with register, and takes fd. It refuses a
	// connection that does not reach the pool, or is not client's uid's.
	Adopt(fd int, client ipc.Cred) (Memory, error)
}

// PoolClient is Pools over the service's own connection to gpupool: it
// adopts each handed-over connection with pool.Client.Adopt.
type PoolClient struct{ C *pool.Client }

// Device implements Pools.
func (p PoolClient) Device() device.Device { return p.C.Device() }

// Path implements Pools: the socket, absolute.
func (p PoolClient) Path() string {
	path := p.C.Path()
	if !strings.HasPrefix(path, "@") {
		if abs, err := filepath.Abs(path); err == nil {
			return abs
		}
	}
	return path
}

// Adopt implements Pools.
func (p PoolClient) Adopt(fd int, client ipc.Cred) (Memory, error) {
	c, err := p.C.Adopt(fd, client.UID, pool.Options{})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Server serves the optimizer protocol (ipc.Handler): each connection
// registers one run, whose optimizer steps on an engine of its own (its
// own stream) over the client's parameter and gradient buffers, mapped
// through the pool connection the client handed over. When a connection
// ends, for any reason, its run's optimizer, state and mappings are
// released; its name is free at once for a new connection of the same uid
// (also while a step of the dead client's still runs).
type Server struct {
	Pool    Pools
	Options ops.Options // of every run's engine (precision)
	// Admission says who may connect (ipc.Admission; the app admits its
	// own uid and root, and --allow-uid and --group).
	Admission ipc.Admission
	// MaxRunBytes bounds the bytes of one run's state and work buffers
	// (0: the pool's --limit and the client uid's quota only).
	MaxRunBytes int64
	// MaxConns is the connection limit of the ipc.Server (reported by
	// stats).
	MaxConns int
	Logf     func(format string, args ...any)

	mu    sync.Mutex
	runs  map[runKey]*session
	conns int
}

// runKey is a run's name in its uid's namespace: two uids may each have a
// run "mlp" (their pool names must still differ, as the pool's names are
// one namespace).
type runKey struct {
	uid  uint32
	name string
}

// Connect implements ipc.Handler: peers Admission refuses are told so.
func (s *Server) Connect(c *ipc.Conn) (ipc.Session, error) {
	cred, err := c.PeerCred()
	if err != nil {
		return nil, err
	}
	if err := s.Admission.Check(cred); err != nil {
		s.logf("optimizer: refused uid %d (pid %d)", cred.UID, cred.PID)
		return nil, err
	}
	s.mu.Lock()
	s.conns++
	s.mu.Unlock()
	return &session{s: s, conn: c, cred: cred}, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// Runs is the number of runs registered.
func (s *Server) Runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// session is one connection's run.
type session struct {
	s    *Server
	conn *ipc.Conn
	cred ipc.Cred

	// Under s.mu: the run's name (key.name != "" once claimed) and the
	// account a takeover revokes.
	key  runKey
	acct *account

	mem    Memory
	e      *ops.Engine
	opt    optim.Optimizer
	opened map[string]*device.Buffer
	peer   *service.Event // the client's: its gradients are written
	own    *service.Event // ours: the step's updates are queued before it
}

// Handle implements ipc.Session.
func (ss *session) Handle(_ context.Context, m *ipc.Message, fds []int) (any, []int, error) {
	switch m.Op {
	case service.OpHello:
		backend := "host"
		if ss.s.Pool.Device().Kind() == device.KindCUDA {
			backend = "cuda"
		}
		return service.HelloReply{Server: "optimizer", PID: os.Getpid(), Backend: backend, Pool: ss.s.Pool.Path(), UID: ss.cred.UID}, nil, nil
	case service.OpRegister:
		req, err := DecodeRegister(m.Body)
		if err != nil {
			return nil, nil, err
		}
		r, err := ss.register(req, fds)
		return r, nil, err
	case service.OpStats:
		return ss.stats(), nil, nil
	}
	if ss.opt == nil {
		if m.Op == service.OpStep || m.Op == service.OpReset || m.Op == service.OpClose {
			return nil, nil, service.ErrNotRegistered
		}
		return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
	}
	switch m.Op {
	case service.OpStep:
		req, err := DecodeStep(m.Body)
		if err != nil {
			return nil, nil, err
		}
		return ss.step(req)
	case service.OpReset:
		if err := ss.peer.Wait(ss.e); err != nil {
			return nil, nil, err
		}
		if err := ss.opt.Reset(ss.e); err != nil {
			return nil, nil, err
		}
		return nil, nil, ss.own.Record(ss.e)
	case service.OpClose:
		ss.release()
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("%w: %q", ipc.ErrUnknownOp, m.Op)
}

func (ss *session) stats() service.StatsReply {
	s := ss.s
	s.mu.Lock()
	r := service.StatsReply{Steps: -1, Run: ss.key.name, MaxRunBytes: s.MaxRunBytes, Runs: len(s.runs), Conns: s.conns,
		MaxConns: s.MaxConns, FDLimit: ipc.FDLimit(), MaxMessage: ipc.MaxMessage, MaxOrder: optim.MaxOrder}
	if ss.acct != nil {
		r.RunBytes = ss.acct.used()
	}
	s.mu.Unlock()
	if ss.opt != nil {
		if st, ok := ss.opt.(optim.Stepper); ok {
			r.Steps = st.Steps()
		}
		if rs, ok := ss.opt.(interface{ RootStats() optim.RootStats }); ok {
			x := rs.RootStats()
			r.Refreshes, r.Failures, r.F64 = x.Refreshes, x.Failures, x.F64
		}
	}
	return r
}

// step runs one step: the engine's stream waits for the client's
// gradients, the optimizer's work is queued, and the service's event is
// recorded behind it; the reply goes as soon as it is queued.
func (ss *session) step(req service.StepRequest) (any, []int, error) {
	if req.LR > 0 {
		ss.opt.SetLR(req.LR)
	}
	if err := ss.peer.Wait(ss.e); err != nil {
		return nil, nil, err
	}
	if err := ss.opt.Step(ss.e); err != nil {
		return nil, nil, err
	}
	if err := ss.own.Record(ss.e); err != nil {
		return nil, nil, err
	}
	r := service.StepReply{Step: -1}
	if st, ok := ss.opt.(optim.Stepper); ok {
		r.Step = st.Steps()
	}
	return r, nil, nil
}

// open maps the buffer name (once per session) through the client's pool
// connection: a name the client's uid could not open is refused the same
// way.
func (ss *session) open(name string) (*device.Buffer, error) {
	if b, ok := ss.opened[name]; ok {
		return b, nil
	}
	b, err := ss.mem.Open(name)
	if err != nil {
		if errors.Is(err, pool.ErrClosed) || errors.Is(err, pool.ErrUnreachable) {
			return nil, fmt.Errorf("optimizer: the run's pool connection: %w", err)
		}
		// The pool's reason, not its code: a client is told which of
		// its references is bad (optimizer.bad_tensor).
		return nil, fmt.Errorf("%w: buffer %q: %v", service.ErrTensor, name, err)
	}
	ss.opened[name] = b
	return b, nil
}

// tensor is the tensor r names, checked against its buffer; where names r
// in the request (for errors).
func (ss *session) tensor(r service.TensorRef, where string) (*tensor.Tensor, error) {
	shape, off, n, err := r.Check(where)
	if err != nil {
		return nil, err
	}
	b, err := ss.open(r.Buffer)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if size := b.Size(); off > size || n > size-off {
		return nil, fmt.Errorf("%w: %s: %s %v at element %d does not fit buffer %q (%d bytes)", service.ErrTensor, where, r.DType, r.Shape, r.Offset, r.Buffer, size)
	}
	dt, _ := tensor.ParseDType(r.DType)
	return &tensor.Tensor{Buf: b, DType: dt, Shape: shape, Strides: tensor.RowMajor(shape), Offset: int(r.Offset)}, nil
}

// claim reserves the run's name in the client's uid. A name held by a
// connection whose client has hung up (killed, or closed without waiting)
// is taken over: its pool names are unbound at once, while its last step
// may still be running in memory that stays leased until it ends.
func (ss *session) claim(name string) (*account, error) {
	s := ss.s
	key := runKey{ss.cred.UID, name}
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[runKey]*session{}
	}
	holder := s.runs[key]
	if holder != nil && !holder.conn.HungUp() {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: run %q is registered by another connection of uid %d", service.ErrRunInUse, name, key.uid)
	}
	var revoked *account
	if holder != nil {
		// The holder keeps its account: its own release revokes it too
		// (waiting for this revocation), so it cannot close its pool
		// connection while the names are being unbound.
		holder.key = runKey{}
		revoked = holder.acct
		s.logf("optimizer: run %q: its client hung up; taking the name over", name)
	}
	acct := &account{max: s.MaxRunBytes}
	ss.key, ss.acct = key, acct
	s.runs[key] = ss
	s.mu.Unlock()
	if revoked != nil {
		revoked.revoke()
	}
	return acct, nil
}

// register builds the run. fds must hold one connection to the pool,
// made by the client, through which everything the run does in the pool
// is done.
func (ss *session) register(req *service.RegisterRequest, fds []int) (_ *service.RegisterReply, err error) {
	if ss.opt != nil || ss.mem != nil {
		return nil, service.ErrRegistered
	}
	if len(fds) != 1 {
		return nil, fmt.Errorf("%w: register carries %d fds; it needs one: a connection to the pool (%s) the client made, unused", ipc.ErrBadRequest, len(fds), ss.s.Pool.Path())
	}
	// The server closes fds after Handle: the run keeps a copy.
	fd, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: keeping the pool connection: %v (the service is out of file descriptors)", ipc.ErrLimit, err)
	}
	acct, err := ss.claim(req.Run)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	defer func() {
		if err != nil {
			ss.release()
		}
	}()
	s := ss.s
	if ss.mem, err = s.Pool.Adopt(fd, ss.cred); err != nil {
		return nil, fmt.Errorf("the pool connection handed over: %w", err)
	}
	acct.setMem(ss.mem)
	ss.opened = map[string]*device.Buffer{}
	if ss.e, err = ops.NewEngine(s.Pool.Device(), s.Options); err != nil {
		return nil, err
	}
	var params []nn.Param
	for i, p := range req.Params {
		where := fmt.Sprintf("params[%d] (%q)", i, p.Name)
		v, err := ss.tensor(p.Value, where+".value")
		if err != nil {
			return nil, err
		}
		g, err := ss.tensor(p.Grad, where+".grad")
		if err != nil {
			return nil, err
		}
		params = append(params, nn.Param{Name: p.Name, Value: v, Grad: g})
	}
	var layers []optim.KFACLayer
	for i, l := range req.Layers {
		where := fmt.Sprintf("layers[%d] (%q)", i, l.Weight)
		k := optim.KFACLayer{Weight: l.Weight, Bias: l.Bias}
		if l.Input == nil || l.OutGrad == nil {
			return nil, fmt.Errorf("%w: %s needs its input and out_grad buffers (the service cannot hook the client's graph)", ipc.ErrBadRequest, where)
		}
		if k.Input, err = ss.tensor(*l.Input, where+".input"); err != nil {
			return nil, err
		}
		if k.OutGrad, err = ss.tensor(*l.OutGrad, where+".out_grad"); err != nil {
			return nil, err
		}
		layers = append(layers, k)
	}
	reply := &service.RegisterReply{}
	var scale *tensor.Tensor
	if req.LRScale != nil {
		if scale, err = ss.tensor(*req.LRScale, "lr_scale"); err != nil {
			return nil, err
		}
		if scale.DType != tensor.F32 || scale.Numel() != 1 {
			return nil, fmt.Errorf("%w: lr_scale is %v %v, want one f32", service.ErrTensor, scale.DType, scale.Shape)
		}
	}
	if ss.opt, err = optim.New(acct, req.Run, params, layers, req.Spec); err != nil {
		return nil, err
	}
	if o, ok := ss.opt.(interface{ SetLRScale(*tensor.Tensor) }); ok && scale != nil {
		o.SetLRScale(scale)
		reply.LRScale = true
	}
	if ss.peer, err = service.OpenEvent(ss.e, req.Event); err != nil {
		return nil, err
	}
	if ss.e.Stream() != 0 && ss.peer == nil {
		return nil, fmt.Errorf("%w: event: a CUDA client must send its event", ipc.ErrBadRequest)
	}
	if ss.own, reply.Event, err = service.NewEvent(ss.e); err != nil {
		return nil, err
	}
	for _, p := range ss.opt.State() {
		reply.State = append(reply.State, service.StateRef{Name: p.Name, Tensor: service.Ref(optim.BufferName(req.Run, p.Name), p.Value)})
	}
	s.logf("optimizer: run %q of uid %d: %s over %d parameters, %d bytes of state", req.Run, ss.cred.UID, req.Spec.Name, len(params), acct.used())
	return reply, nil
}

// release frees everything the session holds: the optimizer (once its
// engine's work is done), the events, the engine, and the run's pool
// connection, whose end gives every lease back to the pool at once.
func (ss *session) release() {
	s := ss.s
	s.mu.Lock()
	acct := ss.acct
	s.mu.Unlock()
	if acct != nil {
		// The run's pool names are unbound before the name is given up,
		// so a new run of that name finds them free (the pool handles a
		// connection's end in its own time).
		acct.revoke()
	}
	var errs []error
	if ss.e != nil {
		errs = append(errs, ss.e.Sync())
	}
	if ss.opt != nil {
		errs = append(errs, ss.opt.Free())
		ss.opt = nil
	}
	if ss.e != nil {
		errs = append(errs, ss.peer.Close(ss.e), ss.own.Close(ss.e))
		ss.peer, ss.own = nil, nil
		errs = append(errs, ss.e.Close())
		ss.e = nil
	}
	ss.opened = nil // their leases end with the connection
	if ss.mem != nil {
		errs = append(errs, ss.mem.Close())
		ss.mem = nil
	}
	s.mu.Lock()
	name := ss.key.name
	if name != "" && s.runs[ss.key] == ss {
		delete(s.runs, ss.key)
	}
	ss.key, ss.acct = runKey{}, nil
	s.mu.Unlock()
	if err := errors.Join(errs...); err != nil && name != "" {
		s.logf("optimizer: run %q released with errors: %v", name, err)
	}
}

// Close implements ipc.Session: the connection ended.
func (ss *session) Close() {
	ss.release()
	ss.s.mu.Lock()
	ss.s.conns--
	ss.s.mu.Unlock()
}

// account is the Allocator a run's optimizer allocates through: its
// run's pool connection, with the bytes counted against MaxRunBytes and
// the names recorded, so that a run whose name is taken over unbinds them
// (revoke) and allocates no more.
type account struct {
	mu      sync.Mutex
	mem     Memory
	max     int64
	bytes   int64
	names   []string
	revoked bool
	once    sync.Once // of revoke: a second caller waits for the first
}

func (a *account) setMem(m Memory) {
	a.mu.Lock()
	a.mem = m
	a.mu.Unlock()
}

// Device implements device.Allocator.
func (a *account) Device() device.Device {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mem.Device()
}

// Alloc implements device.Allocator.
func (a *account) Alloc(name string, size int64) (*device.Buffer, error) {
	a.mu.Lock()
	switch {
	case a.revoked:
		a.mu.Unlock()
		return nil, fmt.Errorf("optimizer: the run's name was taken over (its client hung up)")
	case size < 0 || (a.max > 0 && size > a.max-a.bytes):
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: the run's state would take more than --max-run-bytes %d bytes (%d so far, %d more for %s)", ipc.ErrLimit, a.max, a.bytes, size, name)
	}
	a.bytes += size
	mem := a.mem
	a.mu.Unlock()
	b, err := mem.Alloc(name, size)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.bytes -= size
		return nil, err
	}
	if name != "" {
		a.names = append(a.names, name)
	}
	return b, nil
}

func (a *account) used() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bytes
}

// revoke unbinds the run's pool names (each Remove answered before it
// returns) and refuses later allocations. It runs once; a caller that
// comes while it runs waits for it.
func (a *account) revoke() {
	a.once.Do(func() {
		a.mu.Lock()
		a.revoked = true
		names, mem := a.names, a.mem
		a.names = nil
		a.mu.Unlock()
		if mem == nil {
			return
		}
		for _, n := range names {
			mem.Remove(n) // fails only when the connection is gone, which unbinds them too
		}
	})
}
