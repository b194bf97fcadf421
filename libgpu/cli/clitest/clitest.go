package clitest

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/rogpeppe/go-internal/testscript"
)

// Cmds returns the commands:
//
//	status N PROG [ARGS...]  run PROG as exec does (its stdout and stderr
//	                         are the script's) and fail unless it exits N
//	jsonlines [-count=N] [FILE]
//	                         fail unless every line of FILE (default: the
//	                         last command's stdout) is one JSON object, and
//	                         there are N lines when -count is given
//	validjson FILE           fail unless FILE is one JSON value
//	size FILE BYTES          fail unless FILE holds BYTES bytes
func Cmds() map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	return map[string]func(ts *testscript.TestScript, neg bool, args []string){
		"status":    status,
		"jsonlines": jsonLines,
		"validjson": validJSON,
		"size":      size,
	}
}

// size FILE BYTES: FILE (in the script's work directory) holds exactly
// BYTES bytes (! size: any other count).
func size(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: size FILE BYTES")
	}
	want, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		ts.Fatalf("size: %q is not a byte count", args[1])
	}
	fi, err := os.Stat(ts.MkAbs(args[0]))
	if err != nil {
		ts.Fatalf("size: %v", err)
	}
	switch {
	case neg && fi.Size() == want:
		ts.Fatalf("size: %s holds %d bytes (want another count)", args[0], want)
	case !neg && fi.Size() != want:
		ts.Fatalf("size: %s holds %d bytes (want %d)", args[0], fi.Size(), want)
	}
}

func status(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status N PROG [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("status: %q is not an exit status", args[0])
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("status: %v", err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}

func jsonLines(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! jsonlines")
	}
	count := -1
	if len(args) > 0 && strings.HasPrefix(args[0], "-count=") {
		n, err := strconv.Atoi(strings.TrimPrefix(args[0], "-count="))
		if err != nil {
			ts.Fatalf("jsonlines: bad %s", args[0])
		}
		count, args = n, args[1:]
	}
	file := "stdout"
	if len(args) == 1 {
		file = args[0]
	} else if len(args) > 1 {
		ts.Fatalf("usage: jsonlines [-count=N] [FILE]")
	}
	text := ts.ReadFile(file)
	if text != "" && !strings.HasSuffix(text, "\n") {
		ts.Fatalf("%s does not end with a newline", file)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if text == "" {
		lines = nil
	}
	for i, l := range lines {
		var obj map[string]any
		d := json.NewDecoder(bytes.NewReader([]byte(l)))
		if err := d.Decode(&obj); err != nil || d.More() || obj == nil {
			ts.Fatalf("%s line %d is not one JSON object: %q (%v)", file, i+1, l, err)
		}
	}
	if count >= 0 && len(lines) != count {
		ts.Fatalf("%s has %d JSON lines, want %d", file, len(lines), count)
	}
}

func validJSON(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: validjson FILE")
	}
	ok := json.Valid([]byte(ts.ReadFile(args[0])))
	if ok == neg {
		ts.Fatalf("%s: valid JSON is %v", args[0], ok)
	}
}
