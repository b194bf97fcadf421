package cudatest

import (
	"os"
	"runtime"
	"sync"
	"testing"

	"gpukit/libgpu/cuda"
)

// EnvRequireGPU names the variable that turns a missing GPU from a skip into
// a failure. The GPU test machine sets GPUKIT_REQUIRE_GPU=1.
const EnvRequireGPU = "GPUKIT_REQUIRE_GPU"

var (
	once sync.Once
	ctx  *cuda.Context
	err  error
)

// RequireGPU skips the test when no CUDA device is usable, or fails it
// (t.Fatal) when GPUKIT_REQUIRE_GPU=1. Otherwise it pins the calling test
// goroutine to its OS thread (runtime.LockOSThread, undone in t.Cleanup) and
// makes the primary context of device 0 current on that thread, so the test
// body can call the driver directly. Goroutines the test starts must pin
// themselves and call Context().SetCurrent; subtests (t.Run) run on goroutines
// of their own, so each calls RequireGPU again.
//
// The primary context is retained once per process and never released, so
// tests do not pay for creating it again.
func RequireGPU(t testing.TB) {
	t.Helper()
	once.Do(func() {
		if !cuda.Available() {
			_, e := cuda.DeviceCount()
			if e == nil {
				e = cuda.ErrorNoDevice
			}
			err = e
			return
		}
		d, e := cuda.GetDevice(0)
		if e != nil {
			err = e
			return
		}
		ctx, err = cuda.PrimaryContext(d)
	})
	if err != nil {
		if os.Getenv(EnvRequireGPU) == "1" {
			t.Fatalf("GPU required (%s=1) but not usable: %v", EnvRequireGPU, err)
		}
		t.Skipf("no usable GPU: %v", err)
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	if e := ctx.SetCurrent(); e != nil {
		t.Fatalf("cuCtxSetCurrent: %v", e)
	}
}

// Context returns the primary context of device 0 that RequireGPU made
// current; nil before a successful RequireGPU.
func Context() *cuda.Context { return ctx }
