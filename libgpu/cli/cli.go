package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Exit statuses shared by every tool.
const (
	ExitOK      = 0 // success
	ExitFailure = 1 // a runtime failure: a missing file, an unreachable daemon, a failed compile
	ExitUsage   = 2 // bad command-line input, or a command that is not built yet
)

// ErrUsage marks bad command-line input: the process exits 2. Wrap it with
// Usagef (or fmt.Errorf("%w: ...", ErrUsage)); the message then reads
// "usage: ...".
var ErrUsage = errors.New("usage")

// ErrNotBuilt marks a command a later issue builds: the process exits 2.
var ErrNotBuilt = errors.New("not built yet")

// Usagef returns a usage error (exit 2) with the formatted message.
func Usagef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...)
}

// ExitCode is the process exit status for an error returned by Run: 0 for
// nil, 2 for usage and not-built errors, a ucli.ExitCoder's own status
// (tracer record passes its command's), else 1.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	if errors.Is(err, ErrUsage) || errors.Is(err, ErrNotBuilt) {
		return ExitUsage
	}
	var ec ucli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return ExitFailure
}

// Message is err as one line prefixed with the tool's name: newlines become
// spaces, and a message that already starts with the name keeps it once. It
// is empty for an error with an empty message (a status passed on with
// ucli.Exit("", code)).
func Message(tool string, err error) string {
	msg := strings.TrimSpace(strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(err.Error()))
	if msg == "" {
		return ""
	}
	if strings.HasPrefix(msg, tool+":") || strings.HasPrefix(msg, tool+" ") {
		return msg
	}
	return tool + ": " + msg
}

// Report prints err on w as Message does, followed by a newline; nothing
// for nil or an empty message.
func Report(w io.Writer, tool string, err error) {
	if err == nil {
		return
	}
	if m := Message(tool, err); m != "" {
		fmt.Fprintln(w, m)
	}
}

// Run sets app up (Setup), reorders args so flags may follow positional
// arguments (Permute) and runs it. It prints nothing itself on error.
func Run(app *ucli.App, args []string) error {
	Setup(app)
	err := app.Run(Permute(app, args))
	if errors.Is(err, errVersionShown) {
		return nil
	}
	return err
}

// Main runs app on args (os.Args), prints an error as one line on the
// app's ErrWriter (stderr) and returns the exit status.
func Main(app *ucli.App, args []string) int {
	err := Run(app, args)
	w := app.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	Report(w, app.Name, err)
	return ExitCode(err)
}
