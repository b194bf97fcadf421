package app

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"gpukit/trainer/internal/driver"
)

// TestModelsRegistered: the models linked in by models.go are registered,
// mlp the default.
func TestModelsRegistered(t *testing.T) {
	if got := driver.Names(); !slices.Equal(got, []string{"gpt", "hrm", "mlp", "moe", "unet"}) {
		t.Fatalf("models %v", got)
	}
	if m, _ := driver.DefaultModel(); m.Name != "mlp" {
		t.Fatalf("default model %s", m.Name)
	}
}

// TestMergeCommands: a model's command named like another's adds its
// subcommands (trainer data sudoku beside trainer data shakespeare); a
// second command of a name without subcommands is a programming error.
func TestMergeCommands(t *testing.T) {
	a := []*cli.Command{{Name: "data", Subcommands: []*cli.Command{{Name: "shakespeare"}}}}
	got := mergeCommands(a, []*cli.Command{{Name: "data", Subcommands: []*cli.Command{{Name: "sudoku"}}}, {Name: "solve"}})
	if len(got) != 2 || len(got[0].Subcommands) != 2 || got[0].Subcommands[1].Name != "sudoku" || got[1].Name != "solve" {
		t.Fatalf("merged %v", got)
	}
	if len(a[0].Subcommands) != 1 {
		t.Fatal("merging changed the first command")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("two solve commands: no panic")
		}
	}()
	mergeCommands(got, []*cli.Command{{Name: "solve"}})
}

// TestUsagesHaveNoPlaceholders: no flag's usage, of any command for any
// model, has a backquote, which urfave/cli would render as the flag's
// placeholder ("--ckpt trainer run --model unet").
func TestUsagesHaveNoPlaceholders(t *testing.T) {
	for _, m := range driver.Names() {
		for _, cmd := range []string{"run", "init", "eval", "generate"} {
			app := New(io.Discard, io.Discard, []string{"trainer", cmd, "--model", m})
			var walk func(cs []*cli.Command)
			walk = func(cs []*cli.Command) {
				for _, c := range cs {
					for _, f := range c.Flags {
						if u, ok := f.(cli.DocGenerationFlag); ok && strings.Contains(u.GetUsage(), "`") {
							t.Errorf("--model %s: %s --%s: usage %q has a backquote", m, c.Name, f.Names()[0], u.GetUsage())
						}
					}
					walk(c.Subcommands)
				}
			}
			walk(app.Commands)
		}
	}
}
