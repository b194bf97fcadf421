package kernels

import (
	"fmt"
	"regexp"
)

// Options say how a source is compiled. The zero value is not usable: Arch
// is required.
type Options struct {
	// Arch is the real target, "sm_90a" (see Arch); "compute_90a" is accepted
	// and read as "sm_90a".
	Arch string
	// PTX asks for PTX (compiled for the virtual arch, "compute_90a")
	// instead of a cubin.
	PTX bool
	// FastMath adds --use_fast_math (off by default: it changes results).
	FastMath bool
	// LineInfo adds --generate-line-info (source lines in profilers).
	LineInfo bool
	// Defines are "NAME" or "NAME=VALUE", passed as -DNAME[=VALUE].
	Defines []string
	// IncludeDirs are passed as -I DIR. Their files are not part of the cache
	// key unless they are given as Source.Headers (kernelc resolves the
	// includes it can find and passes them as headers).
	IncludeDirs []string
	// NameExprs are C++ names to instantiate and look up after compiling
	// ("gpukit_scale<float>"); Result.LoweredNames maps each to its mangled
	// symbol.
	NameExprs []string
	// Extra options are passed to NVRTC as they are, after the others.
	Extra []string
}

var defineRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(=.*)?$`)

// Flags returns the NVRTC options: --gpu-architecture=sm_XY[a] (or
// compute_XY[a] with PTX), -std=c++17, -default-device, then the optional
// ones. Never -O3: NVRTC rejects it (its default is already full
// optimisation).
func (o Options) Flags() ([]string, error) {
	if _, _, err := ParseArch(o.Arch); err != nil {
		return nil, err
	}
	arch := realArch(o.Arch)
	if o.PTX {
		arch = virtualArch(arch)
	}
	f := []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	if o.FastMath {
		f = append(f, "--use_fast_math")
	}
	if o.LineInfo {
		f = append(f, "--generate-line-info")
	}
	for _, d := range o.Defines {
		if !defineRE.MatchString(d) {
			return nil, fmt.Errorf("kernels: bad define %q (want NAME or NAME=VALUE)", d)
		}
		f = append(f, "-D"+d)
	}
	for _, d := range o.IncludeDirs {
		f = append(f, "-I"+d)
	}
	return append(f, o.Extra...), nil
}

// keyOptions are the options that decide the output: the NVRTC flags plus
// the name expressions (they instantiate templates).
func (o Options) keyOptions(flags []string) []string {
	k := append([]string(nil), flags...)
	for _, e := range o.NameExprs {
		k = append(k, "name-expr:"+e)
	}
	return k
}
