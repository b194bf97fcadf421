package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"gpukit/libgpu/trace"
)

// JSONLine writes v to w as one line of JSON (no indentation, no HTML
// escaping: "scale<float>" stays readable), the format of every tool's
// machine-readable output.
func JSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// F32 is a float32 default as a float64 flag value without float32 noise:
// F32(0.001) is 0.001, where float64(float32(0.001)) is
// 0.0010000000474974513 (and --help would print that).
func F32(f float32) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	return v
}

// TraceFlag is --trace SOCK (default: $GPUKIT_TRACE, which tracer record
// sets). what says what the tool sends, e.g. "a span per request".
func TraceFlag(what string) *ucli.StringFlag {
	return &ucli.StringFlag{Name: "trace", EnvVars: []string{trace.EnvSocket},
		Usage: "SOCK: send " + what + " to the tracer collector at SOCK (tracer serve, or set by tracer record)"}
}

// StartTrace turns tracing on when --trace (or GPUKIT_TRACE) names a
// collector socket, as the process c.App.Name. The returned func flushes
// and closes the tracer and, when events were dropped, says how many in one
// line on stderr; call it (defer it) before the tool exits.
func StartTrace(c *ucli.Context) (stop func()) { return StartTraceAs(c, c.App.Name) }

// StartTraceAs is StartTrace with the process named process in the trace
// (one rank of a data-parallel job: "trainer rank 1", a track of its own).
func StartTraceAs(c *ucli.Context, process string) (stop func()) {
	tr := trace.Setup(c.String("trace"), process)
	return func() {
		tr.Close()
		if s := tr.Summary(); s != "" {
			fmt.Fprintln(c.App.ErrWriter, c.App.Name+": "+s)
		}
	}
}

// ForceFlag is --force: replace an existing --out (see CheckOut).
func ForceFlag() *ucli.BoolFlag {
	return &ucli.BoolFlag{Name: "force", Usage: "replace an existing --out"}
}

// CheckOut refuses to replace an existing file or directory at path, the
// value of the flag flagName, unless --force is set: a tool MUST NOT
// overwrite a result without a word (TOOLS.md). A directory path passes
// when it has none of the files in keep (a fresh run directory, e.g. one
// made by mktemp -d); give keep only for directories.
func CheckOut(c *ucli.Context, flagName, path string, keep ...string) error {
	if c.Bool("force") {
		return nil
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	if !fi.IsDir() || len(keep) == 0 {
		return fmt.Errorf("--%s %s exists; pass --force to replace it", flagName, path)
	}
	var found []string
	for _, k := range keep {
		if _, err := os.Stat(filepath.Join(path, k)); err == nil {
			found = append(found, k)
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("--%s %s already holds %s; pass --force to replace it", flagName, path, strings.Join(found, ", "))
	}
	return nil
}

// CheckSocketDir checks the directory a daemon is about to listen in. A
// socket path the user named (a flag or an environment variable: named is
// true) must be in an existing directory: a missing one is an error that
// says how to make it, never made silently with a guessed owner and mode.
// A default path (named false) may have its directory made by the daemon
// (libgpu/ipc.Listen, which also checks its owner and mode); mkdir then
// names the directory to announce on stderr, and is "" when it exists.
// Abstract sockets ("@name") have no directory.
func CheckSocketDir(path string, named bool) (mkdir string, err error) {
	if strings.HasPrefix(path, "@") {
		return "", nil
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return "", nil
	case err == nil:
		return "", fmt.Errorf("socket directory %s is not a directory", dir)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("socket directory: %w", err)
	case named:
		return "", fmt.Errorf("socket directory %s does not exist; create it first (mkdir -m 0700 %s, or 0750 with a group) or pick another path", dir, dir)
	}
	return dir, nil
}
