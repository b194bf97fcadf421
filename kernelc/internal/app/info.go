package app

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/kernels"
)

var infoCommand = &cli.Command{
	Name:      "info",
	Usage:     "per kernel: registers, static shared memory, local bytes, launch bound, arch",
	ArgsUsage: "FILE.cubin|FILE.cu...",
	Description: "Reads the cubin's ELF sections (no GPU needed). A .cu file is compiled first, which needs " +
		"NVRTC and --arch (native: the GPU's). Any other file that is not an ELF is refused as not a cubin. " +
		"--json writes one JSON object per kernel.",
	Flags: append([]cli.Flag{
		&cli.BoolFlag{Name: "json", Usage: "one JSON object per kernel on stdout"},
	}, compileFlags...),
	Action: runInfo,
}

// infoLine is the JSON line written per kernel.
type infoLine struct {
	File string `json:"file"`
	Arch string `json:"arch"`
	kernels.KernelInfo
}

func runInfo(c *cli.Context) error {
	if c.NArg() == 0 {
		return kit.Usagef("info: no input files (give FILE.cubin or FILE.cu)")
	}
	var comp *kernels.Compiler
	for _, name := range c.Args().Slice() {
		data, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("info: %w", err)
		}
		if !bytes.HasPrefix(data, []byte("\x7fELF")) {
			if filepath.Ext(name) != ".cu" {
				return fmt.Errorf("info: %s is not a cubin (no ELF header); info reads cubins, and compiles .cu sources first", name)
			}
			if comp == nil {
				if comp, err = compilerFor(c); err != nil {
					return err
				}
			}
			arch, err := resolveArch(c.String("arch"))
			if err != nil {
				return err
			}
			headers, err := resolveIncludes(data, filepath.Dir(name), c.StringSlice("include"))
			if err != nil {
				return err
			}
			opts := optionsFrom(c, arch)
			opts.PTX = false
			r, err := comp.Compile(kernels.Source{Name: name, Code: data, Headers: headers}, opts)
			if err != nil {
				return err
			}
			data = r.Cubin
		}
		info, err := kernels.ParseCubin(data)
		if err != nil {
			return fmt.Errorf("info: %s: %w", name, err)
		}
		if c.Bool("json") {
			for _, k := range info.Kernels {
				writeJSON(stdout(c), infoLine{File: name, Arch: info.Arch, KernelInfo: k})
			}
			continue
		}
		fmt.Fprintf(stdout(c), "%s (%s)\n", name, info.Arch)
		tw := tabwriter.NewWriter(stdout(c), 2, 8, 2, ' ', 0)
		fmt.Fprintf(tw, "  kernel\tregisters\tshared\tlocal\tmax threads\tarch\n")
		for _, k := range info.Kernels {
			mt := "-"
			if k.MaxThreads > 0 {
				mt = fmt.Sprint(k.MaxThreads)
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%s\t%s\n", k.Name, k.Registers, k.SharedBytes, k.LocalBytes, mt, info.Arch)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
