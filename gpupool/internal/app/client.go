package app

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
)

func metaFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dtype", Usage: "dtype metadata stored with the buffer: f32, bf16, f16, i32, i64 or u8"},
		&cli.StringFlag{Name: "shape", Usage: "shape metadata stored with the buffer, comma separated (e.g. 784,128)"},
		&cli.BoolFlag{Name: "legacy", Usage: "a cuMemAlloc buffer with a legacy CUDA IPC handle (for CuPy and PyTorch; cuda pools only)"},
	}
}

// parseDType reads --dtype: "" (none) or a dtype libgpu knows, stored as
// its canonical name (f32, bf16, f16, i32, i64, u8).
func parseDType(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	d, err := tensor.ParseDType(s)
	if err != nil {
		return "", fmt.Errorf("%w: --dtype %q: want f32, bf16, f16, i32, i64 or u8", ErrUsage, s)
	}
	return d.String(), nil
}

func parseShape(s string) ([]int64, error) {
	if s == "" {
		return nil, nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: --shape %q: want non-negative integers separated by commas", ErrUsage, s)
		}
		out = append(out, n)
	}
	return out, nil
}

var allocCommand = &cli.Command{
	Name:      "alloc",
	Usage:     "allocate a named buffer that stays in the pool until removed (gpupool rm)",
	ArgsUsage: "NAME SIZE",
	Flags:     append(clientFlags(), metaFlags()...),
	Action: func(c *cli.Context) error {
		if c.NArg() != 2 {
			return fmt.Errorf("%w: alloc takes NAME SIZE (see gpupool alloc --help)", ErrUsage)
		}
		size, err := ParseSize(c.Args().Get(1))
		if err != nil {
			return err
		}
		shape, err := parseShape(c.String("shape"))
		if err != nil {
			return err
		}
		dtype, err := parseDType(c.String("dtype"))
		if err != nil {
			return err
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		b, err := cl.Create(c.Args().Get(0), size, pool.CreateOptions{
			DType: dtype, Shape: shape, Legacy: c.Bool("legacy"), Sealed: true})
		if err != nil {
			return err
		}
		sh := b.Share()
		fmt.Fprintf(c.App.Writer, "%s %d bytes at offset %d of a %d-byte %s slab\n", c.Args().Get(0), b.Size(), sh.Offset, sh.SlabSize, sh.Kind)
		return nil
	},
}

func removeAction(c *cli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("%w: %s takes NAME (see gpupool %s --help)", ErrUsage, c.Command.Name, c.Command.Name)
	}
	cl, err := dial(c)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.Remove(c.Args().First())
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "remove a named buffer; its memory returns once no client holds a lease on it",
	ArgsUsage: "NAME",
	Flags:     clientFlags(),
	Action:    removeAction,
}

var freeCommand = &cli.Command{
	Name:      "free",
	Usage:     "the same as rm",
	ArgsUsage: "NAME",
	Flags:     clientFlags(),
	Action:    removeAction,
}

var putCommand = &cli.Command{
	Name:      "put",
	Usage:     "store a file's bytes (or stdin's, with -) in a new named buffer: create, write, seal",
	ArgsUsage: "NAME FILE|-",
	Flags: append(clientFlags(), append(metaFlags(),
		&cli.BoolFlag{Name: "ephemeral", Usage: "remove the buffer when this command exits (for tests)"})...),
	Action: func(c *cli.Context) error {
		if c.NArg() != 2 {
			return fmt.Errorf("%w: put takes NAME FILE|- (see gpupool put --help)", ErrUsage)
		}
		shape, err := parseShape(c.String("shape"))
		if err != nil {
			return err
		}
		dtype, err := parseDType(c.String("dtype"))
		if err != nil {
			return err
		}
		in, err := openPutInput(c.Args().Get(1), os.Stdin)
		if err != nil {
			return err
		}
		defer in.Close()
		if in.size == 0 {
			return fmt.Errorf("%w: put: no bytes to store (an empty buffer cannot exist)", ErrUsage)
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		b, err := cl.Create(c.Args().Get(0), in.size, pool.CreateOptions{
			DType: dtype, Shape: shape, Legacy: c.Bool("legacy"), Ephemeral: c.Bool("ephemeral")})
		if err != nil {
			return err
		}
		if err := writeBuffer(cl.Device(), b, in.r); err != nil {
			cl.Remove(b.Name())
			return err
		}
		return b.Seal()
	},
}

var getCommand = &cli.Command{
	Name:      "get",
	Usage:     "write a named buffer's bytes to stdout",
	ArgsUsage: "NAME",
	Flags: append(clientFlags(),
		&cli.DurationFlag{Name: "timeout", Usage: "wait this long for a buffer still being written to be sealed"}),
	Action: func(c *cli.Context) error {
		if c.NArg() != 1 {
			return fmt.Errorf("%w: get takes NAME (see gpupool get --help)", ErrUsage)
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		b, err := cl.OpenWait(c.Args().First(), c.Duration("timeout"))
		if err != nil {
			return err
		}
		defer b.Free()
		return readBuffer(cl.Device(), b, c.App.Writer)
	},
}

func age(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func shapeString(s []int64) string {
	if len(s) == 0 {
		return "-"
	}
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, "x")
}

var lsCommand = &cli.Command{
	Name:  "ls",
	Usage: "list the pool's allocations: name, size, dtype, shape, owner uid, age",
	Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON lines: one object per buffer"}),
	Action: func(c *cli.Context) error {
		if c.Args().Present() {
			return fmt.Errorf("%w: ls takes no arguments (see gpupool ls --help)", ErrUsage)
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		bufs, err := cl.Ls()
		if err != nil {
			return err
		}
		if c.Bool("json") {
			for _, b := range bufs {
				if err := kit.JSONLine(c.App.Writer, b); err != nil {
					return err
				}
			}
			return nil
		}
		w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tSIZE\tDTYPE\tSHAPE\tSLAB\tOFFSET\tLEASES\tKEPT\tSEALED\tUID\tPID\tAGE")
		for _, b := range bufs {
			name, dtype := b.Name, b.DType
			if name == "" {
				name = "-"
			}
			if dtype == "" {
				dtype = "-"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%d\t%d\t%v\t%v\t%d\t%d\t%s\n", name, b.Size, dtype, shapeString(b.Shape),
				b.Slab, b.Offset, b.Leases, b.Kept, b.Sealed, b.OwnerUID, b.OwnerPID, age(b.AgeMS))
		}
		return w.Flush()
	},
}

var statsCommand = &cli.Command{
	Name:  "stats",
	Usage: "print the pool's counters as one JSON line (bytes reserved, used, free, peak; slabs, clients, allocations, fragmentation)",
	Flags: clientFlags(),
	Action: func(c *cli.Context) error {
		if c.Args().Present() {
			return fmt.Errorf("%w: stats takes no arguments (see gpupool stats --help)", ErrUsage)
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		s, err := cl.Stats()
		if err != nil {
			return err
		}
		return kit.JSONLine(c.App.Writer, s)
	},
}
