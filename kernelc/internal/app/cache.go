package app

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

var cacheCommand = &cli.Command{
	Name:  "cache",
	Usage: "show, check or empty the kernel cache",
	Description: "The cache is shared with libgpu: $GPUKIT_CACHE_DIR, else $XDG_CACHE_HOME/gpukit/kernels, " +
		"else ~/.cache/gpukit/kernels (or --cache-dir).",
	Subcommands: []*cli.Command{
		{Name: "path", Usage: "print the cache directory", Action: func(c *cli.Context) error {
			cache, err := openCache(c)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout(c), cache.Dir())
			return nil
		}},
		{Name: "ls", Usage: "list entries: key, payload bytes, time written",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "one JSON object per entry"}},
			Action: func(c *cli.Context) error {
				cache, err := openCache(c)
				if err != nil {
					return err
				}
				es, err := cache.List()
				if err != nil {
					return err
				}
				for _, e := range es {
					if c.Bool("json") {
						writeJSON(stdout(c), map[string]any{"key": e.Key, "bytes": e.Size, "mtime": e.ModTime.UTC().Format(time.RFC3339)})
					} else {
						fmt.Fprintf(stdout(c), "%s %8d %s\n", e.Key, e.Size, e.ModTime.UTC().Format(time.RFC3339))
					}
				}
				return nil
			}},
		{Name: "stats", Usage: "entries and bytes in the cache", Action: func(c *cli.Context) error {
			cache, err := openCache(c)
			if err != nil {
				return err
			}
			s, err := cache.Stats()
			if err != nil {
				return err
			}
			writeJSON(stdout(c), map[string]any{"dir": s.Dir, "entries": s.Entries, "bytes": s.Bytes})
			return nil
		}},
		{Name: "verify", Usage: "check every entry; remove corrupt ones (exit 1 if any)", Action: func(c *cli.Context) error {
			cache, err := openCache(c)
			if err != nil {
				return err
			}
			bad, err := cache.Verify()
			for _, b := range bad {
				fmt.Fprintln(stdout(c), "corrupt (removed): "+b)
			}
			if err != nil {
				return err
			}
			if len(bad) > 0 {
				return fmt.Errorf("cache verify: %d corrupt entries removed", len(bad))
			}
			es, err := cache.List()
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout(c), "ok: %d entries\n", len(es))
			return nil
		}},
		{Name: "clear", Usage: "remove every entry", Action: func(c *cli.Context) error {
			cache, err := openCache(c)
			if err != nil {
				return err
			}
			n, err := cache.Clear()
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout(c), "removed %d entries\n", n)
			return nil
		}},
	},
}
