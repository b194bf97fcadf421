package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/trace"
)

// New returns the kernelc command.
func New() *cli.App {
	return &cli.App{
		Name:  "kernelc",
		Usage: "compile CUDA C++ with NVRTC, report kernel resources, manage the kernel cache",
		Description: "kernelc compiles .cu files to cubins (or PTX) for one GPU architecture through the " +
			"content-addressed cache libgpu uses, reads registers, shared and local memory of each kernel " +
			"from a cubin (no GPU needed), and lists, verifies and clears the cache.",
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cache-dir", Usage: "kernel cache directory", EnvVars: []string{"GPUKIT_CACHE_DIR"},
				DefaultText: "$XDG_CACHE_HOME/gpukit/kernels or ~/.cache/gpukit/kernels"},
			&cli.StringFlag{Name: "trace", Usage: "send trace events to the tracer collector at this socket", EnvVars: []string{trace.EnvSocket}},
		},
		Before: func(c *cli.Context) error {
			trace.Setup(c.String("trace"), "kernelc")
			return nil
		},
		Commands: []*cli.Command{buildCommand, infoCommand, cacheCommand},
	}
}

// Main runs kernelc with args (os.Args) and returns the exit status: 0, or 1
// after printing the error on stderr.
func Main(args []string) int {
	err := New().Run(args)
	if t := trace.Default(); t != nil {
		t.Close()
		if s := t.Summary(); s != "" {
			fmt.Fprintln(os.Stderr, "kernelc: "+s)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernelc: "+message(err))
		return ExitCode(err)
	}
	return 0
}

// message is the error as kernelc prints it: compile errors keep NVRTC's
// (rewritten) log; everything else is one line.
func message(err error) string {
	var ce *kernels.CompileError
	if errors.As(err, &ce) {
		return err.Error()
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// ExitCode maps an error from Run to the process exit status.
func ExitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) && ec.ExitCode() != 0 {
		return ec.ExitCode()
	}
	return 1
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
		return "", err
	}
	return arch, nil
}

func stdout(c *cli.Context) io.Writer { return c.App.Writer }
func stderr(c *cli.Context) io.Writer { return c.App.ErrWriter }

// writeJSON writes v as one JSON line, without HTML escaping (kernel names
// such as "scale<float>" stay readable).
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
