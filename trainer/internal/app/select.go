package app

import (
	"path/filepath"
	"strings"

	"gpukit/trainer/internal/driver"
)

// selection is which model each model-dependent command of a command line
// is about, found before the application is built (its flags are the
// model's): run and init by --model (a resumed run by its state file),
// eval and generate by the checkpoint --ckpt names.
type selection struct {
	cmd     string // the command (first argument that is not a flag)
	model   driver.Model
	unknown string // --model named no registered model
}

// selectModel scans args (os.Args) for the command and its model.
func selectModel(args []string) selection {
	var s selection
	s.model, _ = driver.DefaultModel()
	if len(args) < 2 {
		return s
	}
	rest := args[1:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		rest = rest[1:] // the root's flags (--version, --help) take no value
	}
	if len(rest) == 0 {
		return s
	}
	s.cmd, rest = rest[0], rest[1:]
	switch s.cmd {
	case "run", "init":
		if name, ok := flagValue(rest, "model"); ok {
			m, found := driver.Lookup(name)
			if !found {
				s.unknown = name
				return s
			}
			s.model = m
		} else if dir, ok := flagValue(rest, "resume"); ok && s.cmd == "run" {
			if h, err := driver.ReadHeader(filepath.Join(dir, driver.StateFile)); err == nil {
				if m, ok := driver.ModelOf(h); ok {
					s.model = m
				}
			}
		}
	case "eval", "generate":
		if p, ok := flagValue(rest, "ckpt"); ok {
			if f, _, err := driver.Resolve(p); err == nil {
				if h, err := driver.ReadHeader(f); err == nil {
					if m, ok := driver.ModelOf(h); ok {
						s.model = m
					}
				}
			}
		} else if s.cmd == "generate" && s.model.Generate == nil {
			for _, m := range driver.Models() {
				if m.Generate != nil {
					s.model = m
					break
				}
			}
		}
	}
	return s
}

// flagValue is the value of --name (or -name, --name=V) in args, up to
// "--".
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, p := range []string{"--" + name, "-" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}
