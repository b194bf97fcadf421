package cli

import (
	"errors"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// errVersionShown ends a run after --version printed the version; Run
// turns it into success.
var errVersionShown = errors.New("version shown")

const setupDone = "gpukit/libgpu/cli.setup"

// Setup makes app behave as every gpukit tool must (TOOLS.md): no help
// command, usage errors (unknown command or flag, bad flag value) as one
// line and exit 2 instead of the whole help, a command group without its
// subcommand a usage error, --version on the root, and no os.Exit inside
// urfave/cli. It keeps the app's own Before and Action. Calling it again is
// a no-op; Run calls it.
func Setup(app *ucli.App) {
	if app.Metadata == nil {
		app.Metadata = map[string]any{}
	}
	if app.Metadata[setupDone] != nil {
		return
	}
	app.Metadata[setupDone] = true
	app.HideHelpCommand = true
	app.HideVersion = true // urfave's own --version/-v; ours is below
	app.ExitErrHandler = func(*ucli.Context, error) {}
	app.OnUsageError = usageError
	if flagByName(app.Flags, "version") == nil {
		app.Flags = append(app.Flags, &ucli.BoolFlag{Name: "version", Usage: "print the version and exit"})
	}
	checkFlags(app.Flags)
	before := app.Before
	app.Before = func(c *ucli.Context) error {
		if c.Bool("version") {
			fmt.Fprintf(c.App.Writer, "%s %s\n", c.App.Name, Version())
			return errVersionShown
		}
		if before != nil {
			return before(c)
		}
		return nil
	}
	if app.Action == nil {
		app.Action = groupAction(app.Commands)
	}
	for _, cmd := range app.Commands {
		setupCommand(cmd)
	}
}

func setupCommand(cmd *ucli.Command) {
	cmd.HideHelpCommand = true
	cmd.OnUsageError = usageError
	checkFlags(cmd.Flags)
	if len(cmd.Subcommands) > 0 && cmd.Action == nil {
		cmd.Action = groupAction(cmd.Subcommands)
	}
	for _, s := range cmd.Subcommands {
		setupCommand(s)
	}
}

// helpName is how the command running in c is named in "see ... --help".
func helpName(c *ucli.Context) string {
	if c.Command != nil && c.Command.HelpName != "" {
		return c.Command.HelpName
	}
	return c.App.Name
}

func usageError(c *ucli.Context, err error, _ bool) error {
	return Usagef("%v (see %s --help)", err, helpName(c))
}

// groupAction runs for a command group given no subcommand or an unknown one.
func groupAction(cmds []*ucli.Command) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		if c.Args().Present() {
			return Usagef("unknown command %q (see %s --help)", c.Args().First(), helpName(c))
		}
		var names []string
		for _, s := range cmds {
			if !s.Hidden {
				names = append(names, s.Name)
			}
		}
		if len(names) == 0 {
			return Usagef("nothing to do (see %s --help)", helpName(c))
		}
		return Usagef("missing command: one of %s (see %s --help)", strings.Join(names, ", "), helpName(c))
	}
}

// Require returns a usage error naming the first of the flags that is not
// set. Tools call it instead of marking flags Required: urfave/cli prints
// the whole help on stdout for a missing required flag.
func Require(c *ucli.Context, names ...string) error {
	for _, n := range names {
		if !c.IsSet(n) {
			return Usagef("missing --%s (see %s --help)", n, helpName(c))
		}
	}
	return nil
}

// NoArgs returns a usage error when c has positional arguments.
func NoArgs(c *ucli.Context) error {
	if c.Args().Present() {
		return Usagef("unexpected argument %q: %s takes none (see %s --help)", c.Args().First(), helpName(c), helpName(c))
	}
	return nil
}

// NotBuilt is a command that is not built: it takes any arguments, says
// so in one line and exits 2. instead, when not empty, says what to use
// meanwhile ("use bench/unet.sh ..."); else the line says a later issue
// builds it.
func NotBuilt(name, usage, instead string) *ucli.Command {
	if instead == "" {
		instead = "a later issue builds it"
	}
	return &ucli.Command{
		Name:            name,
		Usage:           usage + " (not built yet)",
		SkipFlagParsing: true,
		HideHelp:        true,
		Action: func(*ucli.Context) error {
			return fmt.Errorf("%s: %w; %s", name, ErrNotBuilt, instead)
		},
	}
}

func flagByName(flags []ucli.Flag, name string) ucli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}
