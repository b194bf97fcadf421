package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
)

// compile times NVRTC through libgpu/kernels on every .cu source libgpu
// embeds, in host milliseconds per source:
//
//	compile_cold pch=on|off  no cache: NVRTC runs for each source
//	compile_warm             the cache is warm: lookup, sha256 check and
//	                         cuModuleLoadData, what a tool pays on first use
//
// The reference side compiles the same sources with CuPy's RawModule.
func (b *bench) compile(w Workload) (Result, error) {
	dc, err := kernels.ForContext(b.ctx)
	if err != nil {
		return Result{}, err
	}
	arch := dc.Arch()
	var srcs []kernels.Source
	for _, name := range kernels.Sources() {
		if !strings.HasSuffix(name, ".cu") {
			continue
		}
		src, err := kernels.Embedded(name)
		if err != nil {
			return Result{}, err
		}
		srcs = append(srcs, src)
	}
	opts := kernels.EmbeddedOptions(arch)
	switch w.Name {
	case "compile_cold":
		nv := kernels.NewNVRTC()
		if w.PCH == "off" {
			nv = kernels.NewNVRTCWithoutPCH()
		}
		c := kernels.NewCompiler(nv, nil)
		if _, err := c.Compile(srcs[0], opts); err != nil { // load NVRTC itself outside the timing
			return Result{}, err
		}
		t0 := time.Now()
		for _, s := range srcs {
			if _, err := c.Compile(s, opts); err != nil {
				return Result{}, err
			}
		}
		return Result{MS: ms(time.Since(t0)) / float64(len(srcs)), Note: fmt.Sprintf("%d sources", len(srcs))}, nil
	case "compile_warm":
		dir, err := os.MkdirTemp("", "gpukit-bench-cache")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(dir)
		cache, err := kernels.OpenCache(filepath.Join(dir, "kernels"))
		if err != nil {
			return Result{}, err
		}
		c := kernels.NewCompiler(kernels.NewNVRTC(), cache)
		for _, s := range srcs {
			if _, err := c.Compile(s, opts); err != nil {
				return Result{}, err
			}
		}
		const reps = 20
		t0 := time.Now()
		for r := 0; r < reps; r++ {
			for _, s := range srcs {
				res, err := c.Compile(s, opts)
				if err != nil {
					return Result{}, err
				}
				if !res.CacheHit {
					return Result{}, fmt.Errorf("%s: cache miss on a warm cache", s.Name)
				}
				mod, err := cuda.ModuleLoadData(res.Image())
				if err != nil {
					return Result{}, err
				}
				if err := mod.Unload(); err != nil {
					return Result{}, err
				}
			}
		}
		return Result{MS: ms(time.Since(t0)) / float64(reps*len(srcs)), Note: fmt.Sprintf("%d sources", len(srcs))}, nil
	}
	return Result{}, fmt.Errorf("unknown workload %q", w.Name)
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
