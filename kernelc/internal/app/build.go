package app

import (
	"fmt"
	"gpukit/libgpu/atomicfile"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/kernels"
)

var compileFlags = []cli.Flag{
	&cli.StringFlag{Name: "arch", Value: "native", Usage: "target: native (ask the GPU), sm_90a, sm_90, sm_80, ..."},
	&cli.StringSliceFlag{Name: "define", Aliases: []string{"D"}, Usage: "define a macro: NAME or NAME=VAL"},
	&cli.StringSliceFlag{Name: "include", Aliases: []string{"I"}, Usage: "add an include directory"},
	&cli.StringSliceFlag{Name: "name-expr", Usage: "instantiate and look up a name, e.g. 'scale<float>' (repeatable)"},
	&cli.BoolFlag{Name: "fast-math", Usage: "--use_fast_math (changes results)"},
	&cli.BoolFlag{Name: "lineinfo", Usage: "emit source line info for profilers"},
	&cli.BoolFlag{Name: "no-cache", Usage: "always run NVRTC; read and write no cache"},
}

var buildCommand = &cli.Command{
	Name:      "build",
	Usage:     "compile .cu files to cubins (or PTX)",
	ArgsUsage: "FILE.cu... | -",
	Description: "Each FILE.cu becomes FILE.cubin (FILE.ptx with --ptx) beside it; with one file, -o names " +
		"the output, with several, -o is a directory. '-' reads the source from stdin and writes the image " +
		"to stdout. Files compile in parallel. A JSON line per output goes to stdout (not when the image " +
		"itself does). --libgpu compiles every kernel libgpu embeds into the cache.",
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output file (one input) or directory (several)"},
		&cli.BoolFlag{Name: "ptx", Usage: "write PTX instead of a cubin"},
		&cli.BoolFlag{Name: "libgpu", Usage: "compile every kernel libgpu embeds into the cache"},
		kit.IntAtLeast(&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.GOMAXPROCS(0), Usage: "parallel compilations"}, 1),
	}, compileFlags...),
	Action: runBuild,
}

// buildResult is the JSON line written per output.
type buildResult struct {
	Source   string            `json:"source"`
	Output   string            `json:"output,omitempty"`
	Arch     string            `json:"arch"`
	Key      string            `json:"key"`
	CacheHit bool              `json:"cache_hit"`
	Bytes    int               `json:"bytes"`
	Lowered  map[string]string `json:"lowered,omitempty"`
}

type job struct {
	in, out string
	src     kernels.Source
}

func compilerFor(c *cli.Context) (*kernels.Compiler, error) {
	var cache *kernels.Cache
	if !c.Bool("no-cache") {
		var err error
		if cache, err = openCache(c); err != nil {
			return nil, err
		}
	}
	comp := kernels.NewCompiler(kernels.NewNVRTC(), cache)
	comp.OnCorrupt = func(key string, err error) {
		fmt.Fprintf(stderr(c), "kernelc: cache entry %s was corrupt (%v); removed and recompiled\n", key[:12], err)
	}
	return comp, nil
}

func optionsFrom(c *cli.Context, arch string) kernels.Options {
	o := kernels.Options{
		Arch: arch, PTX: c.Bool("ptx"), FastMath: c.Bool("fast-math"), LineInfo: c.Bool("lineinfo"),
		Defines: c.StringSlice("define"), IncludeDirs: c.StringSlice("include"), NameExprs: c.StringSlice("name-expr"),
	}
	if d := toolkitInclude(); d != "" {
		o.IncludeDirs = append(o.IncludeDirs, d)
	}
	return o
}

func runBuild(c *cli.Context) error {
	if c.Bool("libgpu") {
		return buildLibgpu(c)
	}
	if c.NArg() == 0 {
		return kit.Usagef("build: no input files (give FILE.cu..., or - for stdin)")
	}
	// Validate options before touching NVRTC or the GPU.
	if c.String("arch") != "native" {
		if _, err := (kernels.Options{Arch: c.String("arch"), Defines: c.StringSlice("define")}).Flags(); err != nil {
			return usage(err)
		}
	}
	jobs, err := planJobs(c)
	if err != nil {
		return err
	}
	arch, err := resolveArch(c.String("arch"))
	if err != nil {
		return err
	}
	comp, err := compilerFor(c)
	if err != nil {
		return err
	}
	opts := optionsFrom(c, arch)
	if _, err := opts.Flags(); err != nil {
		return err
	}
	results := make([]kernels.Result, len(jobs))
	errs := make([]error, len(jobs))
	parallel(len(jobs), c.Int("jobs"), func(i int) { results[i], errs[i] = comp.Compile(jobs[i].src, opts) })
	var failed []error
	for i, j := range jobs {
		if errs[i] != nil {
			failed = append(failed, errs[i])
			continue
		}
		r := results[i]
		if r.Log != "" {
			fmt.Fprintln(stderr(c), r.Log)
		}
		if err := writeOutput(c, j.out, r.Image()); err != nil {
			failed = append(failed, err)
			continue
		}
		if r.CacheErr != nil {
			fmt.Fprintf(stderr(c), "kernelc: %s: compiled but not cached: %v\n", j.in, r.CacheErr)
		}
		if j.out == "-" {
			for e, l := range r.LoweredNames {
				fmt.Fprintf(stderr(c), "kernelc: %s = %s\n", e, l)
			}
			continue
		}
		writeJSON(stdout(c), buildResult{Source: j.in, Output: j.out, Arch: r.Arch, Key: r.Key,
			CacheHit: r.CacheHit, Bytes: len(r.Image()), Lowered: r.LoweredNames})
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	// Several files failed: print all but the last here, return the last.
	for _, e := range failed[:len(failed)-1] {
		fmt.Fprintln(stderr(c), "kernelc: "+message(e))
	}
	return failed[len(failed)-1]
}

// planJobs reads the inputs and decides the outputs.
func planJobs(c *cli.Context) ([]job, error) {
	ext := ".cubin"
	if c.Bool("ptx") {
		ext = ".ptx"
	}
	in := c.Args().Slice()
	out := c.String("output")
	var jobs []job
	for _, name := range in {
		var code []byte
		var err error
		var dir string
		srcName := name
		if name == "-" {
			if len(in) > 1 {
				return nil, kit.Usagef("build: '-' (stdin) must be the only input")
			}
			code, err = io.ReadAll(os.Stdin)
			srcName, dir = "stdin.cu", "."
		} else {
			code, err = os.ReadFile(name)
			dir = filepath.Dir(name)
		}
		if err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
		headers, err := resolveIncludes(code, dir, c.StringSlice("include"))
		if err != nil {
			return nil, err
		}
		j := job{in: name, src: kernels.Source{Name: srcName, Code: code, Headers: headers}}
		switch {
		case name == "-" && out == "":
			j.out = "-"
		case len(in) == 1 && out != "":
			j.out = out
		case out != "":
			if err := os.MkdirAll(out, 0o755); err != nil {
				return nil, fmt.Errorf("build: -o: %w", err)
			}
			j.out = filepath.Join(out, strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))+ext)
		default:
			j.out = strings.TrimSuffix(name, filepath.Ext(name)) + ext
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// writeOutput writes img to path atomically ("-": stdout).
func writeOutput(c *cli.Context, path string, img []byte) error {
	if path == "-" {
		_, err := stdout(c).Write(img)
		return err
	}
	if err := atomicfile.Write(path, atomicfile.Options{}, func(w io.Writer) error {
		_, err := w.Write(img)
		return err
	}); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	return nil
}

// buildLibgpu compiles every embedded kernel into the cache, with the
// options libgpu uses at run time (kernels.EmbeddedOptions).
func buildLibgpu(c *cli.Context) error {
	if c.Bool("no-cache") {
		return kit.Usagef("build --libgpu fills the cache; it cannot be combined with --no-cache")
	}
	if c.NArg() > 0 {
		return kit.Usagef("build --libgpu takes no files")
	}
	arch, err := resolveArch(c.String("arch"))
	if err != nil {
		return err
	}
	comp, err := compilerFor(c)
	if err != nil {
		return err
	}
	names := kernels.Sources()
	results := make([]kernels.Result, len(names))
	errs := make([]error, len(names))
	parallel(len(names), c.Int("jobs"), func(i int) {
		src, err := kernels.Embedded(names[i])
		if err == nil {
			results[i], err = comp.Compile(src, kernels.EmbeddedOptions(arch))
		}
		errs[i] = err
	})
	for i, name := range names {
		r := results[i]
		if errs[i] != nil {
			return errs[i]
		}
		if r.CacheErr != nil { // warming the cache is the point of --libgpu
			return fmt.Errorf("libgpu/kernels/%s: %w", name, r.CacheErr)
		}
		writeJSON(stdout(c), buildResult{Source: "libgpu/kernels/" + name, Arch: r.Arch, Key: r.Key,
			CacheHit: r.CacheHit, Bytes: len(r.Cubin)})
	}
	return nil
}

// parallel runs f(0), ..., f(n−1) with at most jobs at once.
func parallel(n, jobs int, f func(i int)) {
	sem := make(chan struct{}, max(1, jobs))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}
