package app

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"
)

var allocCommand = &cli.Command{
	Name:      "alloc",
	Usage:     "allocate a named buffer that stays in the pool until freed by name",
	ArgsUsage: "NAME SIZE",
	Flags:     clientFlags(),
	Action: func(c *cli.Context) error {
		if c.NArg() != 2 {
			return fmt.Errorf("%w: alloc takes NAME SIZE (see gpupool alloc --help)", ErrUsage)
		}
		size, err := ParseSize(c.Args().Get(1))
		if err != nil {
			return err
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		b, err := cl.AllocKeep(c.Args().Get(0), size)
		if err != nil {
			return err
		}
		sh := b.Share()
		fmt.Fprintf(c.App.Writer, "%s %d bytes at offset %d of a %d-byte %s slab\n", c.Args().Get(0), b.Size(), sh.Offset, sh.SlabSize, sh.Kind)
		return nil
	},
}

var freeCommand = &cli.Command{
	Name:      "free",
	Usage:     "unbind a named buffer; its memory returns when no client holds it",
	ArgsUsage: "NAME",
	Flags:     clientFlags(),
	Action: func(c *cli.Context) error {
		if c.NArg() != 1 {
			return fmt.Errorf("%w: free takes NAME (see gpupool free --help)", ErrUsage)
		}
		cl, err := dial(c)
		if err != nil {
			return err
		}
		defer cl.Close()
		return cl.FreeName(c.Args().First())
	},
}

var lsCommand = &cli.Command{
	Name:  "ls",
	Usage: "list the pool's allocations",
	Flags: append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON"}),
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
			enc := json.NewEncoder(c.App.Writer)
			enc.SetIndent("", "  ")
			return enc.Encode(bufs)
		}
		w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tSIZE\tSLAB\tOFFSET\tLEASES\tKEPT\tUID\tPID")
		for _, b := range bufs {
			name := b.Name
			if name == "" {
				name = "-"
			}
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%v\t%d\t%d\n", name, b.Size, b.Slab, b.Offset, b.Leases, b.Kept, b.OwnerUID, b.OwnerPID)
		}
		return w.Flush()
	},
}

var statsCommand = &cli.Command{
	Name:  "stats",
	Usage: "print the pool's counters as JSON (bytes reserved, used, free, peak; slabs, clients, allocations)",
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
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	},
}
