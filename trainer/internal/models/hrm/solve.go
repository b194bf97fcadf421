package hrm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/ckpt"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
)

// solveIdle is how long solve waits for more lines before it solves the
// puzzles it holds (stdin from a person or a slow pipe: answers come
// without waiting for a full batch).
const solveIdle = 100 * time.Millisecond

// solveCommand is `trainer solve`: puzzles on stdin, solutions on stdout.
func solveCommand() *cli.Command {
	return &cli.Command{
		Name:  "solve",
		Usage: "solve Sudoku puzzles from stdin with an HRM checkpoint",
		Description: "Reads puzzles from stdin, one per line: 81 characters, row by row, '1'-'9' given, '.' or '0' blank\n" +
			"(qqwing's one-line form; blank lines are skipped). Prints one JSON line per puzzle, in input order:\n" +
			"{\"line\": N, \"solution\": 81 characters ('.' where the model put no digit), \"segments\": the segments\n" +
			"used, \"valid\": whether the solution is a complete grid that keeps every given (checked, not assumed)}.\n" +
			"Puzzles are solved in batches of --batch as they come (a batch waits at most 0.1 s for more lines),\n" +
			"with halting (--no-halt: always --halt-max-steps segments). A bad line (wrong length, another\n" +
			"character, a digit twice in a row, column or box) is refused with its line number on stderr and the\n" +
			"others are solved; trainer solve then exits 1. Input with no valid puzzle at all exits 2 before the\n" +
			"model is loaded. --ckpt takes a checkpoint file (the run's, trainer init's or hrm.py's) or a run\n" +
			"directory (its best.safetensors, else its model.safetensors).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "ckpt", Usage: "FILE|DIR: (required) an HRM checkpoint, or a run directory"},
			&cli.IntFlag{Name: "batch", Value: 256, Usage: "puzzles per batch (768 for throughput on a GPU)"},
			&cli.BoolFlag{Name: "no-halt", Usage: "run every puzzle --halt-max-steps segments instead of halting"},
		}, driver.DeviceFlags("each batch's evaluation")...),
		Action: solveAction,
	}
}

// puzzleLine is one valid puzzle of stdin.
type puzzleLine struct {
	n int // line number, 1-based
	g sudoku.Grid
}

// parseLine reads one line of solve's input: ok false for a blank line,
// an error for a bad one.
func parseLine(s string) (g sudoku.Grid, ok bool, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return g, false, nil
	}
	if g, err = sudoku.ParseGrid(s); err != nil {
		return g, false, err
	}
	if err := g.Check(); err != nil {
		return g, false, err
	}
	return g, true, nil
}

func solveAction(c *cli.Context) error {
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	if err := kit.Require(c, "ckpt"); err != nil {
		return err
	}
	in, err := driver.NewInput(c, "")
	if err != nil {
		return err
	}
	batch := c.Int("batch")
	if batch < 1 || batch > 1<<16 {
		return kit.Usagef("--batch %d: want 1 to 65536", batch)
	}
	file, which, err := driver.Resolve(c.String("ckpt"))
	if err != nil {
		return fmt.Errorf("--ckpt: %w", err)
	}
	f, _, err := readCheckpoint(file)
	if err != nil {
		return err
	}
	in.Ckpt = file
	if which != "" {
		fmt.Fprintf(c.App.ErrWriter, "trainer: solve reads %s, %s\n", file, which)
	}
	defer kit.StartTrace(c)()
	var r io.Reader = os.Stdin
	if c.App.Reader != nil {
		r = c.App.Reader
	}
	s := &solver{c: c, in: in, f: f, batch: batch, halting: !c.Bool("no-halt"), out: bufio.NewWriter(c.App.Writer)}
	defer s.close()
	return s.run(r)
}

// solver streams stdin's puzzles through the model in batches.
type solver struct {
	c       *cli.Context
	in      *driver.Input
	f       *ckpt.File
	batch   int
	halting bool
	out     *bufio.Writer
	l       *loaded // made at the first batch

	bad, solved, valid, segs int
}

func (s *solver) close() {
	if s.l != nil {
		s.l.free()
	}
}

// run reads lines in a goroutine and solves what it holds whenever
// --batch puzzles are waiting, stdin is idle for solveIdle, or it ends.
func (s *solver) run(r io.Reader) error {
	type item struct {
		text string
		err  error
		eof  bool
	}
	lines := make(chan item, 4*s.batch)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- item{text: sc.Text()}
		}
		lines <- item{err: sc.Err(), eof: true}
	}()
	var pending []puzzleLine
	n := 0
	idle := time.NewTimer(solveIdle)
	idle.Stop()
	for {
		var it item
		select {
		case it = <-lines:
		case <-idle.C:
			if err := s.flush(pending, false); err != nil {
				return err
			}
			pending = pending[:0]
			continue
		}
		if it.eof {
			if it.err != nil {
				return fmt.Errorf("solve: reading stdin after line %d: %w", n, it.err)
			}
			break
		}
		n++
		g, ok, err := parseLine(it.text)
		if err != nil {
			s.bad++
			fmt.Fprintf(s.c.App.ErrWriter, "trainer: solve: line %d refused: %v\n", n, err)
			continue
		}
		if !ok {
			continue
		}
		pending = append(pending, puzzleLine{n: n, g: g})
		if len(pending) == s.batch {
			if err := s.flush(pending, false); err != nil {
				return err
			}
			pending = pending[:0]
		}
		idle.Reset(solveIdle)
	}
	idle.Stop()
	if err := s.flush(pending, true); err != nil {
		return err
	}
	if s.solved == 0 {
		return kit.Usagef("solve: no valid puzzle on stdin (%d lines, %d refused): want 81-character lines of 1-9 and '.' or '0'", n, s.bad)
	}
	if s.l != nil {
		fmt.Fprintf(s.c.App.ErrWriter, "trainer: solve: %d puzzles, %d valid solutions, mean segments %.2f (%s on %v)\n",
			s.solved, s.valid, float64(s.segs)/float64(s.solved), s.in.Ckpt, s.l.dev)
	}
	if s.bad > 0 {
		return fmt.Errorf("solve: %d of %d lines refused (named above); the others were solved", s.bad, n)
	}
	return nil
}

// flush solves ps and prints their lines; the model is built at the
// first batch (at its size when stdin ended within it: no padding for a
// few puzzles).
func (s *solver) flush(ps []puzzleLine, eof bool) error {
	if len(ps) == 0 {
		return nil
	}
	if s.l == nil {
		b := s.batch
		if eof {
			b = min(b, len(ps))
		}
		var err error
		if s.l, err = open(s.in, s.f, b); err != nil {
			return err
		}
	}
	inputs := make([]sudoku.Grid, len(ps))
	for i, p := range ps {
		inputs[i] = p.g
	}
	res, err := s.l.ev.Evaluate(tokens(inputs), nil, nn.HRMEvalOptions{Halting: s.halting, Graph: s.in.Graph})
	if err != nil {
		return err
	}
	for i, p := range ps {
		var sol sudoku.Grid
		for j := range sol {
			if d := res.Answers[i*sudoku.Cells+j]; d >= 2 {
				sol[j] = d - 1
			}
		}
		ok := sudoku.CheckSolution(p.g, sol) == nil
		if err := kit.JSONLine(s.out, solution{Line: p.n, Solution: sol.String(), Segments: int(res.Segments[i]), Valid: ok}); err != nil {
			return err
		}
		s.solved++
		s.segs += int(res.Segments[i])
		if ok {
			s.valid++
		}
	}
	return s.out.Flush()
}

// solution is one line of solve's output.
type solution struct {
	Line     int    `json:"line"`
	Solution string `json:"solution"`
	Segments int    `json:"segments"`
	Valid    bool   `json:"valid"`
}
