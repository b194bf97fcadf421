package app

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
)

// New returns the kernelc command; Main runs it.
func New() *cli.App {
	var stopTrace func()
	return &cli.App{
		Name:  "kernelc",
		Usage: "compile CUDA C++ with NVRTC, report kernel resources, manage the kernel cache",
		Description: "kernelc compiles .cu files to cubins (or PTX) for one GPU architecture through the " +
			"content-addressed cache libgpu uses, reads registers, shared and local memory of each kernel " +
			"from a cubin (no GPU needed), and lists, verifies and clears the cache.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cache-dir", Usage: "kernel cache directory", EnvVars: []string{"GPUKIT_CACHE_DIR"},
				DefaultText: "$XDG_CACHE_HOME/gpukit/kernels or ~/.cache/gpukit/kernels"},
			kit.TraceFlag("a span per compilation and cache lookup"),
		},
		Before: func(c *cli.Context) error {
			stopTrace = kit.StartTrace(c)
			return nil
		},
		After: func(*cli.Context) error {
			if stopTrace != nil {
				stopTrace()
			}
			return nil
		},
		Commands: []*cli.Command{buildCommand, infoCommand, cacheCommand},
	}
}

// Main runs kernelc with args (os.Args) through libgpu/cli and returns the
// exit status (0, 1, or 2 for bad usage), having printed an error on stderr.
func Main(args []string) int {
	err := kit.Run(New(), args)
	if err != nil {
		fmt.Fprintln(os.Stderr, message(err))
	}
	return kit.ExitCode(err)
}

// message is the error as kernelc prints it: compile errors keep NVRTC's
// (rewritten) log; everything else is one line.
func message(err error) string {
	var ce *kernels.CompileError
	if errors.As(err, &ce) {
		return "kernelc: " + err.Error()
	}
	return kit.Message("kernelc", err)
}

// usage marks err (bad flag input found by libgpu) as a usage error: exit 2.
func usage(err error) error {
	if err == nil || errors.Is(err, kit.ErrUsage) {
		return err
	}
	return fmt.Errorf("%w: %w", kit.ErrUsage, err)
}

// openCache opens the cache named by --cache-dir / GPUKIT_CACHE_DIR, else the
// default location.
func openCache(c *cli.Context) (*kernels.Cache, error) {
	dir := c.String("cache-dir")
	if dir == "" {
		d, err := kernels.DefaultCacheDir()
		if err != nil {
			return nil, err
		}
		dir = d
	}
	return kernels.OpenCache(dir)
}

// resolveArch turns --arch into a real arch; "native" asks device 0.
func resolveArch(arch string) (string, error) {
	if arch == "" || arch == "native" {
		d, err := cuda.GetDevice(0)
		var ma, mi int
		if err == nil {
			ma, mi, err = d.ComputeCapability()
		}
		if err != nil {
			return "", fmt.Errorf("--arch native needs a GPU (%v); give the arch, e.g. --arch sm_90a", err)
		}
		return kernels.Arch(ma, mi), nil
	}
	if _, _, err := kernels.ParseArch(arch); err != nil {
		return "", usage(err)
	}
	return arch, nil
}

func stdout(c *cli.Context) io.Writer { return c.App.Writer }
func stderr(c *cli.Context) io.Writer { return c.App.ErrWriter }

// writeJSON writes v as one JSON line (kit.JSONLine: kernel names such as
// "scale<float>" stay readable).
func writeJSON(w io.Writer, v any) { _ = kit.JSONLine(w, v) }
