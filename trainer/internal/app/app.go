package app

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/trainer/internal/driver"
)

// New returns the trainer application for the command line args (the
// model-dependent commands take the flags of the model args select: see
// selectModel). stdout carries JSON lines, stderr human messages. Run it
// with Main (libgpu/cli owns exit statuses and error lines).
func New(stdout, stderr io.Writer, args []string) *cli.App {
	sel := selectModel(args)
	var models []string
	for _, m := range driver.Models() {
		models = append(models, m.Name+" ("+m.Summary+")")
	}
	cmds := []*cli.Command{
		runCommand(sel),
		evalCommand(sel),
		initCommand(sel),
		generateCommand(sel),
		infoCommand(),
		launchCommand(),
		kit.NotBuilt("bench", "time training steps against bench/reference (with the CUDA backend)", ""),
		kit.NotBuilt("serve", "serve a model's weights to other tools through the pool", ""),
	}
	for _, m := range driver.Models() {
		cmds = mergeCommands(cmds, m.Commands)
	}
	return &cli.App{
		Name:  "trainer",
		Usage: "train, evaluate and sample models on gpukit ops: " + strings.Join(models, ", "),
		Description: "trainer runs the forward pass, backward pass and optimizer step of a model on a GPU (the\n" +
			"whole step replayed as CUDA graphs) or on the host, with parameters, gradients and optimizer state\n" +
			"allocated in-process or through a gpupool daemon (--pool). JSON lines go to stdout, human messages\n" +
			"and progress to stderr. `trainer run --model NAME --help` lists a model's flags.",
		Writer:    stdout,
		ErrWriter: stderr,
		Commands:  cmds,
	}
}

// mergeCommands adds a model's commands to cmds; one named like an
// existing command adds its subcommands to that one (`trainer data
// sudoku` beside another model's `trainer data ...`).
func mergeCommands(cmds, more []*cli.Command) []*cli.Command {
	cmds = slices.Clone(cmds)
	for _, c := range more {
		i := slices.IndexFunc(cmds, func(o *cli.Command) bool { return o.Name == c.Name })
		switch {
		case i < 0:
			cmds = append(cmds, c)
		case len(cmds[i].Subcommands) > 0 && len(c.Subcommands) > 0 && cmds[i].Action == nil && c.Action == nil:
			merged := *cmds[i]
			merged.Subcommands = append(slices.Clone(merged.Subcommands), c.Subcommands...)
			cmds[i] = &merged
		default:
			panic(fmt.Sprintf("trainer: two commands named %q", c.Name))
		}
	}
	return cmds
}

// Main runs the application on args and returns the exit status (0, 1, or
// 2 for bad usage and commands not built yet): every error becomes one line
// on stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	app := New(stdout, stderr, args)
	err := explainFlag(kit.Run(app, args), selectModel(args))
	kit.Report(stderr, app.Name, err)
	return kit.ExitCode(err)
}

var undefinedFlag = regexp.MustCompile(`flag provided but not defined: -+([A-Za-z0-9][A-Za-z0-9_-]*)`)

// explainFlag turns "flag provided but not defined" for a flag of another
// model (`trainer run --model mlp --steps 3`) into one line that says so.
func explainFlag(err error, sel selection) error {
	if err == nil || (sel.cmd != "run" && sel.cmd != "init") {
		return err
	}
	sm := undefinedFlag.FindStringSubmatch(err.Error())
	if sm == nil {
		return err
	}
	var owners []string
	for _, m := range driver.Models() {
		if m.HasFlag(sm[1]) {
			owners = append(owners, "--model "+m.Name)
		}
	}
	if len(owners) == 0 {
		return err
	}
	return kit.Usagef("--%s is not a flag of --model %s but of %s (see trainer %s --model %s --help)",
		sm[1], sel.model.Name, strings.Join(owners, ", "), sel.cmd, sel.model.Name)
}
