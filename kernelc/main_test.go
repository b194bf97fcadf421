package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"gpukit/kernelc/internal/app"
	"gpukit/libgpu/cli/clitest"
	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/kernels/cubintest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"kernelc": func() { os.Exit(app.Main(os.Args)) },
	})
}

// TestScripts runs testdata/script/*.txtar against the real kernelc.
// Conditions: [nvrtc] NVRTC loads; [gpu] a CUDA device answers (scripts
// start with "[!gpu] skip"; with GPUKIT_REQUIRE_GPU=1 a missing GPU fails
// the script instead). Commands beyond testscript's own:
//
//	mkcubin FILE            write a synthetic cubin (see cubintest) with the
//	                        kernels gpukit_axpy (37 regs, 1024 B shared,
//	                        16 B local) and gpukit_bound (12 regs, bound 256)
//	cacheput DIR FILE       store FILE's bytes in the cache at DIR under Key(FILE)
//	corruptone DIR          invert the last byte of the first cache entry in DIR
//
// and status, jsonlines and validjson from libgpu/cli/clitest.
func TestScripts(t *testing.T) {
	cmds := clitest.Cmds()
	for name, f := range scriptCmds {
		cmds[name] = f
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(e *testscript.Env) error {
			e.Setenv("GPUKIT_CACHE_DIR", e.WorkDir+"/cache")
			e.Setenv("GPUKIT_REQUIRE_GPU", os.Getenv("GPUKIT_REQUIRE_GPU"))
			e.Setenv("GPUKIT_CUDA_PATH", os.Getenv("GPUKIT_CUDA_PATH"))
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "gpu":
				n, err := cuda.DeviceCount()
				if err == nil && n > 0 {
					return true, nil
				}
				if os.Getenv("GPUKIT_REQUIRE_GPU") == "1" {
					return false, fmt.Errorf("GPU required (GPUKIT_REQUIRE_GPU=1) but not usable: %v", err)
				}
				return false, nil
			case "nvrtc":
				_, _, err := cuda.NVRTCVersion()
				return err == nil, nil
			}
			return false, nil
		},
		Cmds: cmds,
	})
}

var scriptCmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"mkcubin": func(ts *testscript.TestScript, neg bool, args []string) {
		img := cubintest.Build(cubintest.Cubin{ABIVersion: 7, Flags: cubintest.Flags(7, 90, true),
			Kernels: []cubintest.Kernel{
				{Name: "gpukit_axpy", Registers: 37, RegRecord: true, SharedBytes: 1024, FrameBytes: 16},
				{Name: "gpukit_bound", TextRegs: 12, MaxThreads: [3]int{256, 1, 1}},
			}})
		ts.Check(os.WriteFile(ts.MkAbs(args[0]), img, 0o644))
	},
	"cacheput": func(ts *testscript.TestScript, neg bool, args []string) {
		c, err := kernels.OpenCache(ts.MkAbs(args[0]))
		ts.Check(err)
		b, err := os.ReadFile(ts.MkAbs(args[1]))
		ts.Check(err)
		ts.Check(c.Put(kernels.Key(b, nil, "test", "sm_90a"), b))
	},
	"corruptone": func(ts *testscript.TestScript, neg bool, args []string) {
		c, err := kernels.OpenCache(ts.MkAbs(args[0]))
		ts.Check(err)
		es, err := c.List()
		ts.Check(err)
		if len(es) == 0 {
			ts.Fatalf("no entries in %s", args[0])
		}
		p := filepath.Join(c.Dir(), es[0].Key)
		b, err := os.ReadFile(p)
		ts.Check(err)
		b[len(b)-1] ^= 0xff
		ts.Check(os.WriteFile(p, b, 0o644))
	},
}
