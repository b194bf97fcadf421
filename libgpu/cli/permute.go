package cli

import (
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Permute returns args (os.Args: the program first) with the flags of the
// command being run moved before its positional arguments, so that
// "kernelc build a.cu -o a.cubin" means what "kernelc build -o a.cubin
// a.cu" means. (urfave/cli/v2, like Go's flag package, stops at the first
// positional argument and would take "-o" for a file name.)
//
// Rules: the command is found by its name (or an alias) after the flags of
// each parent; a flag that takes a value takes the next argument unless it
// is written -flag=value; "--" ends the flags and everything after it stays
// positional; an unknown flag is kept as a flag, so it is reported as one.
// A command with SkipFlagParsing gets its arguments untouched. A command
// whose ArgsUsage starts with "--" (tracer record: "-- CMD [ARGS...]") runs
// another command line: its own flags are looked for only before its first
// positional argument, and everything from there on belongs to that command
// line. With -h or --help among the flags the positional arguments are
// dropped: the command's help is shown.
func Permute(app *ucli.App, args []string) []string {
	if len(args) == 0 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	flags, cmds := app.Flags, app.Commands
	var cmd *ucli.Command // nil: the root
	for {
		if cmd != nil && cmd.SkipFlagParsing {
			return append(out, rest...)
		}
		if len(cmds) == 0 {
			break
		}
		// Flags of a group come before its subcommand's name.
		i, next := scanFlags(flags, rest)
		if next == nil {
			break
		}
		name := rest[i]
		sub := findCommand(cmds, name)
		if sub == nil {
			break
		}
		out = append(out, rest[:i+1]...)
		rest = rest[i+1:]
		cmd, flags, cmds = sub, sub.Flags, sub.Subcommands
	}
	passthrough := cmd != nil && strings.HasPrefix(strings.TrimSpace(cmd.ArgsUsage), "--")
	var fl, pos []string
	help := false
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if !isFlag(a) {
			if passthrough {
				pos = append(pos, rest[i:]...)
				break
			}
			pos = append(pos, a)
			continue
		}
		fl = append(fl, a)
		help = help || a == "-h" || a == "--help" || a == "-help"
		if takesValue(flags, a) && i+1 < len(rest) {
			i++
			fl = append(fl, rest[i])
		}
	}
	out = append(out, fl...)
	if help {
		return out // the command's help; urfave/cli would take an argument for a help topic
	}
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}

// scanFlags skips the leading flags (and their values) of args; it returns
// the index of the first positional argument and that argument, or nil when
// there is none or "--" comes first.
func scanFlags(flags []ucli.Flag, args []string) (int, *string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return i, nil
		}
		if !isFlag(a) {
			return i, &args[i]
		}
		if takesValue(flags, a) {
			i++
		}
	}
	return len(args), nil
}

func findCommand(cmds []*ucli.Command, name string) *ucli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// isFlag reports whether a looks like a flag: "-x" or "--x", but not "-"
// (stdin) or "--".
func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' && a != "--" }

// takesValue reports whether flag argument a (-name or --name, without
// "=value") names a flag in flags that takes a value. Unknown flags and the
// built-in help and version flags take none.
func takesValue(flags []ucli.Flag, a string) bool {
	name := strings.TrimLeft(a, "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := flagByName(flags, name)
	if f == nil {
		return false
	}
	if v, ok := f.(interface{ TakesValue() bool }); ok {
		return v.TakesValue()
	}
	return true
}
