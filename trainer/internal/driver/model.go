package driver

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// Model is one model of the trainer as its package registers it
// (Register, from an init func): its name, its flags, how its task is
// made from them, and its commands. The trainer's command line is built
// from the registered models; nothing outside the model's package names
// its flags.
type Model struct {
	// Name is --model NAME and the metadata "model" of its checkpoints.
	Name string
	// Summary says in a few words what it is and what it trains on, for
	// help texts: "Fashion-MNIST classifier".
	Summary string
	// Default marks the model `trainer run` trains without --model (one
	// model sets it).
	Default bool
	// Data is what --data names for this model.
	Data DataFlag
	// Lines documents the JSON lines of its runs on stdout (the run
	// command's help, after the lines every model writes).
	Lines string
	// Flags are the model's own flags of `trainer run` and `trainer
	// init` (beside the driver's: --out, --data, --resume, --log-every,
	// --device, ...). A flag of another model is refused.
	Flags []cli.Flag
	// Resumable names the Flags a resumed run may change (--steps: the
	// new total); the checkpoint fixes every other one.
	Resumable []string
	// Defaults are the model's defaults of the driver's flags of `trainer
	// run` where they differ ({"precision": "bf16"}; --log-every,
	// --precision, --graph, --device).
	Defaults map[string]string
	// DataParallel: several ranks (trainer launch, torchrun, srun) may
	// train it together; the run command then also takes --bucket-mb,
	// --grad-comm, --shard-optimizer, --last-bucket-mb, --comm-priority,
	// --nccl-min-ctas and --nccl-max-ctas, and Task.Build gets Env.DP.
	DataParallel bool
	// New makes a fresh run's task from the flags; errors that are bad
	// flag values wrap ErrConfig (Configf).
	New func(c *cli.Context) (Task, error)
	// Resume makes a resumed run's task from its stored configuration and
	// the Resumable flags set on c.
	Resume func(c *cli.Context, s Stored) (Task, error)
	// Eval and Generate are `trainer eval` and `trainer generate` for
	// this model's checkpoints (nil: the command says the model has
	// none).
	Eval, Generate *Command
	// Commands are more top-level commands of the model (`trainer solve`);
	// a command named like another model's (`data`) merges its
	// subcommands into that one (`trainer data sudoku`).
	Commands []*cli.Command
	// Foreign, when set, claims checkpoints without trainer metadata
	// (e.g. a PyTorch file of an MLP: fc<i>.weight): eval reads them as
	// this model's.
	Foreign func(h *ckpt.Header) bool
}

// DataFlag is what --data means for a model.
type DataFlag struct {
	Usage       string   // "DIR: directory with the Fashion-MNIST IDX files (gzip'd or not)"
	Value       string   // the default
	DefaultText string   // the default as help shows it, when not Value
	EnvVars     []string // environment variables that set it
}

// Stored is a run's checkpoint as Model.Resume gets it: the model's
// configuration (Task.Config as JSON), the state file's metadata (the
// model's own keys, such as "tokenizer") and the steps done. The tensors
// reach the trainer through Trainer.Load.
type Stored struct {
	Config json.RawMessage
	Meta   map[string]string
	Step   int
}

// Command is a model's `trainer eval` or `trainer generate`: its flags
// (beside --ckpt, --data, --device, --pool, --graph, --precision and
// --trace) and its action on the checkpoint in.
type Command struct {
	Usage       string
	Description string
	// Data, when set, is what --data means for this command (nil: the
	// model's Data; a language model's eval defaults to the text its run
	// trained on).
	Data   *DataFlag
	Flags  []cli.Flag
	Action func(c *cli.Context, in *Input) error
}

// Input is what a model's eval or generate command is given: the
// checkpoint file (--ckpt, or the file a run directory holds: Resolve),
// the precision and graph flags, and the allocator of --device or --pool,
// made on demand (call it after checking the flags: it may start a GPU).
type Input struct {
	Ckpt      string
	Precision ops.Precision
	Graph     bool
	Alloc     func() (device.Allocator, func(), error)
}

var (
	regMu  sync.Mutex
	models = map[string]Model{}
)

// Register adds a model; its package calls it from an init func. A
// second model of a name, an empty name, a model without New or Resume
// or a second default is a programming error: Register panics.
func Register(m Model) {
	regMu.Lock()
	defer regMu.Unlock()
	switch {
	case m.Name == "" || m.New == nil || m.Resume == nil:
		panic(fmt.Sprintf("driver: model %q registered without a name, New or Resume", m.Name))
	case models[m.Name].Name != "":
		panic(fmt.Sprintf("driver: model %q registered twice", m.Name))
	}
	if m.Default {
		for _, o := range models {
			if o.Default {
				panic(fmt.Sprintf("driver: models %q and %q are both the default", o.Name, m.Name))
			}
		}
	}
	for _, f := range m.Flags {
		for _, n := range f.Names() {
			if slices.Contains(Reserved, n) {
				panic(fmt.Sprintf("driver: model %q: --%s is a flag of the driver", m.Name, n))
			}
		}
	}
	if m.Data.Usage == "" {
		panic(fmt.Sprintf("driver: model %q registered without a Data description", m.Name))
	}
	for _, f := range m.Resumable {
		if !slices.ContainsFunc(m.Flags, func(fl cli.Flag) bool { return slices.Contains(fl.Names(), f) }) {
			panic(fmt.Sprintf("driver: model %q: resumable flag --%s is not one of its flags", m.Name, f))
		}
	}
	models[m.Name] = m
}

// Lookup is the model registered as name.
func Lookup(name string) (Model, bool) {
	regMu.Lock()
	defer regMu.Unlock()
	m, ok := models[name]
	return m, ok
}

// Models are the registered models, by name.
func Models() []Model {
	regMu.Lock()
	defer regMu.Unlock()
	out := make([]Model, 0, len(models))
	for _, m := range models {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// DefaultModel is the model registered with Default (the first by name
// when none is).
func DefaultModel() (Model, bool) {
	ms := Models()
	for _, m := range ms {
		if m.Default {
			return m, true
		}
	}
	if len(ms) > 0 {
		return ms[0], true
	}
	return Model{}, false
}

// Names are the registered models' names, by name.
func Names() []string {
	var out []string
	for _, m := range Models() {
		out = append(out, m.Name)
	}
	return out
}

// HasFlag reports whether the model has a flag named name.
func (m Model) HasFlag(name string) bool {
	return slices.ContainsFunc(m.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), name) })
}
