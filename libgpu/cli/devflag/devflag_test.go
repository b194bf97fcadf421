package devflag

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
)

// app has one command, run, with the four flags; its action reads them
// and opens the allocator, recording what it found.
type seen struct {
	ran   bool
	prec  ops.Precision
	graph bool
	kind  device.Kind
	pool  bool
}

func app(o, e *bytes.Buffer, s *seen) *cli.App {
	return &cli.App{
		Name: "tool", Writer: o, ErrWriter: e,
		Commands: []*cli.Command{{
			Name:  "run",
			Flags: []cli.Flag{Pool("allocate there"), Device(), Graph("the step"), Precision(ops.PrecBF16, "the GEMMs")},
			Action: func(c *cli.Context) error {
				s.ran = true
				var err error
				if s.prec, err = PrecisionOf(c); err != nil {
					return err
				}
				if s.graph, err = GraphOn(c); err != nil {
					return err
				}
				a, closeFn, err := Open(c)
				if err != nil {
					return err
				}
				defer closeFn()
				s.kind = a.Device().Kind()
				_, s.pool = a.(*pool.Client)
				return nil
			},
		}},
	}
}

func run(args ...string) (code int, stderr string, s seen) {
	var o, e bytes.Buffer
	code = kit.Main(app(&o, &e, &s), append([]string{"tool", "run"}, args...))
	return code, e.String(), s
}

// TestChecksAsParsed: a bad value of any of the flags is a usage error
// naming it, before the command runs; good ones are read as given.
func TestChecksAsParsed(t *testing.T) {
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"--graph", "maybe"}, `tool: usage: --graph "maybe": want on or off`},
		{[]string{"--graph", ""}, `tool: usage: --graph "": want on or off`},
		{[]string{"--precision", "f16"}, `tool: usage: --precision "f16": want f32, tf32 or bf16`},
		{[]string{"--device", "tpu"}, `tool: usage: --device "tpu": want host, cuda[:N], N or auto`},
		{[]string{"--device", "gpu1"}, `tool: usage: --device "gpu1": want host, cuda[:N], N or auto`},
		{[]string{"--device", "cuda:-1"}, `tool: usage: --device "cuda:-1": want host, cuda[:N], N or auto`},
		{[]string{"--device", "cuda5"}, `tool: usage: --device "cuda5": want host, cuda[:N], N or auto`},
	} {
		code, stderr, s := run(c.args...)
		if code != kit.ExitUsage || s.ran || stderr != c.say+"\n" {
			t.Errorf("%q: exit %d, ran %v, stderr %q; want exit 2 before the command with %q", c.args, code, s.ran, stderr, c.say)
		}
	}
	code, stderr, s := run("--device", "host")
	if code != 0 || s.prec != ops.PrecBF16 || !s.graph || s.kind != device.KindHost || s.pool {
		t.Fatalf("defaults: exit %d (%q), %+v", code, stderr, s)
	}
	code, stderr, s = run("--device", "host", "--graph", "off", "--precision", "f32")
	if code != 0 || s.prec != ops.PrecF32 || s.graph {
		t.Fatalf("--graph off --precision f32: exit %d (%q), %+v", code, stderr, s)
	}
}

func TestCUDAOrdinal(t *testing.T) {
	for s, want := range map[string]int{"cuda": 0, "cuda:0": 0, "cuda:3": 3, "7": 7} {
		if n, ok := CUDAOrdinal(s); !ok || n != want {
			t.Errorf("CUDAOrdinal(%q) = %d, %v; want %d", s, n, ok, want)
		}
	}
	for _, s := range []string{"", "host", "auto", "cuda:", "cuda:x", "-1", "cuda:-2", "gpu0", "cuda5"} {
		if n, ok := CUDAOrdinal(s); ok {
			t.Errorf("CUDAOrdinal(%q) = %d, true", s, n)
		}
	}
}

// TestOpenNoSuchGPU: a GPU that is not there is a failure (exit 1) that
// says so, whether or not the machine has other GPUs.
func TestOpenNoSuchGPU(t *testing.T) {
	code, stderr, s := run("--device", "cuda:99")
	if code != kit.ExitFailure || !s.ran || !strings.HasPrefix(stderr, "tool: --device cuda:99: no such GPU here") ||
		!strings.Contains(stderr, "use --device host") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// hostPool answers hello as a gpupool daemon serving host memory.
type hostPool struct{}

func (hostPool) Connect(*ipc.Conn) (ipc.Session, error) { return hostPool{}, nil }
func (hostPool) Close()                                 {}
func (hostPool) Handle(_ context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	if m.Op == pool.OpHello {
		return pool.HelloReply{Server: "gpupool", Protocol: ipc.Version, Backend: "host", Share: device.ShareMemfd}, nil, nil
	}
	return nil, nil, ipc.ErrUnknownOp
}

// TestOpenPool: with --pool the allocator is the pool's client, whose
// device --device must match unless auto; an unreachable pool is a failure
// naming --pool.
func TestOpenPool(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pool.sock")
	l, err := ipc.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &ipc.Server{Handler: hostPool{}}
	go srv.Serve(l)
	t.Cleanup(srv.Shutdown)
	for _, dev := range []string{"auto", "host"} {
		code, stderr, s := run("--pool", sock, "--device", dev)
		if code != 0 || !s.pool || s.kind != device.KindHost {
			t.Errorf("--pool --device %s: exit %d (%q), %+v", dev, code, stderr, s)
		}
	}
	for _, dev := range []string{"cuda", "cuda:1", "0"} {
		code, stderr, _ := run("--pool", sock, "--device", dev)
		if want := "tool: --device " + dev + ": the pool at " + sock + " serves host memory"; code != kit.ExitFailure || !strings.HasPrefix(stderr, want) {
			t.Errorf("--pool --device %s: exit %d, stderr %q; want exit 1 with %q", dev, code, stderr, want)
		}
	}
	none := filepath.Join(t.TempDir(), "none.sock")
	code, stderr, _ := run("--pool", none)
	if want := "tool: --pool " + none + ": pool: daemon unreachable"; code != kit.ExitFailure || !strings.HasPrefix(stderr, want) {
		t.Errorf("unreachable pool: exit %d, stderr %q; want %q", code, stderr, want)
	}
}
