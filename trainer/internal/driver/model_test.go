package driver

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestRegisterChecks: a model is registered once, with New and Resume, a
// --data description, no flag named like the driver's and only its own
// flags resumable; anything else panics at init, naming the model.
func TestRegisterChecks(t *testing.T) {
	ok := func(name string) Model {
		return Model{Name: name, Data: DataFlag{Usage: "FILE"}, Flags: []cli.Flag{&cli.IntFlag{Name: "steps"}},
			Resumable: []string{"steps"},
			New:       func(*cli.Context) (Task, error) { return nil, nil },
			Resume:    func(*cli.Context, Stored) (Task, error) { return nil, nil }}
	}
	Register(ok("regtest"))
	if m, found := Lookup("regtest"); !found || !m.HasFlag("steps") || m.HasFlag("epochs") {
		t.Fatalf("Lookup: %v %v", m.Name, found)
	}
	for what, m := range map[string]Model{
		"registered twice": ok("regtest"),
		"a flag of the driver": func() Model {
			m := ok("regtest2")
			m.Flags = append(m.Flags, &cli.StringFlag{Name: "out"})
			return m
		}(),
		"resumable flag --epochs": func() Model { m := ok("regtest3"); m.Resumable = []string{"epochs"}; return m }(),
		"without a name, New":     func() Model { m := ok("regtest4"); m.Resume = nil; return m }(),
		"without a Data":          func() Model { m := ok("regtest5"); m.Data = DataFlag{}; return m }(),
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), what) {
					t.Errorf("%s: Register recovered %v", what, r)
				}
			}()
			Register(m)
		}()
	}
}
