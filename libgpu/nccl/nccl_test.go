package nccl

import (
	"context"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func TestResultNames(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{SystemError, "ncclSystemError (2)"},
		{RemoteError, "ncclRemoteError (6)"},
		{Timeout, "ncclTimeout (8)"},
		{Result(42), "ncclResult_t(42)"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("%#v: %q, want %q", c.err, got, c.want)
		}
	}
	for code, name := range resultNames {
		if !strings.HasPrefix(name, "nccl") || code.Name() != name {
			t.Errorf("Result %d: %q", code, name)
		}
	}
	err := error(&CallError{Func: "ncclCommInitRankScalable", Err: SystemError, Detail: "socket connect failed"})
	if !errors.Is(err, SystemError) || errors.Is(err, InternalError) {
		t.Errorf("errors.Is on %v", err)
	}
	if err.Error() != "nccl: ncclCommInitRankScalable: ncclSystemError (2): socket connect failed" {
		t.Errorf("message %q", err)
	}
}

func TestVersionAndID(t *testing.T) {
	for _, c := range []struct {
		v    Version
		want string
	}{{22703, "2.27.3"}, {22300, "2.23.0"}, {2803, "2.8.3"}, {21003, "2.10.3"}} {
		if got := c.v.String(); got != c.want {
			t.Errorf("Version(%d) = %q, want %q", int(c.v), got, c.want)
		}
	}
	if unsafe.Sizeof(UniqueID{}) != 128 {
		t.Errorf("UniqueID is %d bytes, want NCCL_UNIQUE_ID_BYTES = 128", unsafe.Sizeof(UniqueID{}))
	}
	var id UniqueID
	id[0], id[127] = 0xab, 0x01
	if s := id.String(); len(s) != 256 || !strings.HasPrefix(s, "ab00") || !strings.HasSuffix(s, "01") {
		t.Errorf("id %q", s)
	}
}

// TestMissingLibrary: without NCCL (CI), every entry point says in one line
// which library is missing and which variable points at it.
func TestMissingLibrary(t *testing.T) {
	if Available() {
		t.Skipf("NCCL %v is installed here (%s)", version, LibraryPath())
	}
	err := load()
	if !errors.Is(err, cuda.ErrNoLibrary) && !errors.Is(err, ErrTooOld) {
		t.Fatalf("load: %v", err)
	}
	msg := err.Error()
	if errors.Is(err, cuda.ErrNoLibrary) &&
		(!strings.HasPrefix(msg, "nccl: libnccl.so.2 not found (") || !strings.Contains(msg, "GPUKIT_CUDA_PATH") || strings.Contains(msg, "\n")) {
		t.Errorf("message %q", msg)
	}
	if _, err := NewUniqueID(); err == nil || err.Error() != msg {
		t.Errorf("NewUniqueID: %v", err)
	}
	if _, err := LibraryVersion(); err == nil {
		t.Errorf("LibraryVersion without NCCL")
	}
}

// TestNVLSOffReachesC: loading NCCL (even failing to) sets
// NCCL_NVLS_ENABLE=0 when unset, in the C environment NCCL reads.
func TestNVLSOffReachesC(t *testing.T) {
	load()
	v := os.Getenv(EnvNVLS)
	if v == "" {
		t.Fatalf("%s unset after load", EnvNVLS)
	}
	libc := cuda.NewLibrary("test", "?", "libc.so.6")
	if libc.Load() != nil {
		t.Skip("no libc.so.6 to ask")
	}
	name := append([]byte(EnvNVLS), 0)
	p, err := libc.Proc("getenv").Call(uintptr(unsafe.Pointer(&name[0])))
	if err != nil {
		t.Fatal(err)
	}
	if got := cString(p, 64); got != v {
		t.Fatalf("C getenv(%s) = %q, Go sees %q", EnvNVLS, got, v)
	}
}

func hostSetup(t *testing.T) (*ops.Engine, device.Allocator) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: h}
}

func upload(t *testing.T, a device.Allocator, dt tensor.DType, v ...float32) *tensor.Tensor {
	t.Helper()
	x, err := tensor.Alloc(a, "", dt, len(v))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WriteFloat32(v); err != nil {
		t.Fatal(err)
	}
	return x
}

func values(t *testing.T, x *tensor.Tensor) []float32 {
	t.Helper()
	v, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSoloCollectives: a communicator of one rank (world size 1, on the
// host too) copies, checks its arguments like any other, and refuses work
// once closed.
func TestSoloCollectives(t *testing.T) {
	e, a := hostSetup(t)
	c := Solo(e.Device())
	if c.Rank() != 0 || c.Size() != 1 || !c.IsSolo() || c.AsyncError() != nil {
		t.Fatalf("solo: rank %d size %d", c.Rank(), c.Size())
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		src, dst := upload(t, a, dt, 1, 2, 3, 4), upload(t, a, dt, 0, 0, 0, 0)
		colls := map[string]func() error{
			"all-reduce":     func() error { return c.AllReduce(e, dst, src, Avg) },
			"broadcast":      func() error { return c.Broadcast(e, dst, src, 0) },
			"all-gather":     func() error { return c.AllGather(e, dst, src) },
			"reduce-scatter": func() error { return c.ReduceScatter(e, dst, src, Sum) },
		}
		for name, op := range colls {
			if err := dst.WriteFloat32([]float32{9, 9, 9, 9}); err != nil {
				t.Fatal(err)
			}
			if err := op(); err != nil {
				t.Fatalf("%v %s: %v", dt, name, err)
			}
			if got := values(t, dst); !reflect.DeepEqual(got, []float32{1, 2, 3, 4}) {
				t.Errorf("%v %s: %v", dt, name, got)
			}
		}
		if err := c.AllReduce(e, src, src, Sum); err != nil || !reflect.DeepEqual(values(t, src), []float32{1, 2, 3, 4}) {
			t.Errorf("%v in place: %v", dt, err)
		}
	}
	f, b := upload(t, a, tensor.F32, 1, 2), upload(t, a, tensor.BF16, 1, 2)
	three, i64 := upload(t, a, tensor.F32, 1, 2, 3), &tensor.Tensor{Buf: f.Buf, DType: tensor.DType(99), Shape: []int{1}, Strides: []int{1}}
	for name, err := range map[string]error{
		"dtypes differ":     c.AllReduce(e, f, b, Sum),
		"counts differ":     c.AllReduce(e, f, three, Sum),
		"unknown op":        c.AllReduce(e, f, f, Op(17)),
		"unknown dtype":     c.AllReduce(e, i64, i64, Sum),
		"missing tensor":    c.AllReduce(e, nil, f, Sum),
		"root out of range": c.Broadcast(e, f, nil, 1),
		"gather count":      c.AllGather(e, three, f),
		"scatter count":     c.ReduceScatter(e, three, f, Sum),
		"strided":           c.AllReduce(e, &tensor.Tensor{Buf: f.Buf, DType: tensor.F32, Shape: []int{1, 2}, Strides: []int{1, 3}}, f, Sum),
	} {
		if !errors.Is(err, ErrArg) {
			t.Errorf("%s: %v, want ErrArg", name, err)
		}
	}
	ran := false
	if err := c.Group(e, func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Group: %v, ran %v", err, ran)
	}
	if err := c.BroadcastAll(e, []*tensor.Tensor{f, b}, 0); err != nil {
		t.Errorf("BroadcastAll: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(e, f, f, Sum); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestNoGPU: several ranks on a host engine are refused with one line
// before any network or library is touched; one rank is Solo.
func TestNoGPU(t *testing.T) {
	e, _ := hostSetup(t)
	if _, err := NewComm(e, UniqueID{}, 0, 2); !errors.Is(err, ErrNoGPU) {
		t.Errorf("NewComm on the host: %v", err)
	}
	if _, err := NewComm(e, UniqueID{}, 2, 2); !errors.Is(err, ErrArg) {
		t.Errorf("NewComm of rank 2 of 2: %v", err)
	}
	w := dist.World{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, MasterAddr: "127.0.0.1", MasterPort: 1, RendezvousPort: 1}
	_, err := Connect(t.Context(), e, &dist.Rendezvous{World: w})
	if !errors.Is(err, ErrNoGPU) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Connect of 2 ranks on the host: %v", err)
	}
	c, err := Connect(t.Context(), e, &dist.Rendezvous{World: dist.Single()})
	if err != nil || !c.IsSolo() {
		t.Errorf("Connect of one rank: %v", err)
	}
}

// TestConfig: the ncclConfig_t head has nccl.h's layout (NCCL 2.23:
// minCTAs at 24, maxCTAs at 28, netName at 32, 48 bytes), carries NCCL's
// magic and the oldest version this package drives, leaves unset fields
// undefined (INT_MIN) and is not passed at all for the zero Config; bad
// CTA bounds are refused before anything else, even for one rank.
func TestConfig(t *testing.T) {
	var c config
	if unsafe.Sizeof(c) != 48 || unsafe.Offsetof(c.minCTAs) != 24 || unsafe.Offsetof(c.maxCTAs) != 28 ||
		unsafe.Offsetof(c.netName) != 32 || unsafe.Offsetof(c.splitShare) != 40 {
		t.Fatalf("ncclConfig_t head: %d bytes, minCTAs at %d, maxCTAs at %d, netName at %d", unsafe.Sizeof(c),
			unsafe.Offsetof(c.minCTAs), unsafe.Offsetof(c.maxCTAs), unsafe.Offsetof(c.netName))
	}
	if (Config{}).ncclConfig() != nil {
		t.Error("the zero Config is passed to NCCL")
	}
	got := *Config{MaxCTAs: 4}.ncclConfig()
	want := config{size: 48, magic: 0xcafebeef, version: 22300, blocking: math.MinInt32, cgaClusterSize: math.MinInt32,
		minCTAs: math.MinInt32, maxCTAs: 4, splitShare: math.MinInt32}
	if got != want {
		t.Errorf("config %+v, want %+v", got, want)
	}
	e, _ := hostSetup(t)
	for _, bad := range []Config{{MinCTAs: -1}, {MaxCTAs: -2}, {MinCTAs: 8, MaxCTAs: 4}} {
		if _, err := ConnectConfig(context.Background(), e, &dist.Rendezvous{World: dist.Single()}, bad); !errors.Is(err, ErrArg) {
			t.Errorf("%+v: %v, want ErrArg", bad, err)
		}
	}
	if c, err := ConnectConfig(context.Background(), e, &dist.Rendezvous{World: dist.Single()}, Config{MinCTAs: 2, MaxCTAs: 2}); err != nil || !c.IsSolo() {
		t.Errorf("one rank: %v, %v", c, err)
	}
}
