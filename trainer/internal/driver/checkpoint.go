package driver

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"gpukit/libgpu/atomicfile"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gpukit/libgpu/ckpt"
)

// Files of a run directory (--out).
//
//	model.safetensors  the model's tensors only, under the names of the
//	                   matching PyTorch module, so that its strict
//	                   load_state_dict takes the file; metadata format
//	                   (FormatModel), model, config (the model's JSON
//	                   configuration), step and the model's own keys
//	best.safetensors   the same, of the evaluation with the lowest
//	                   validation loss so far (models that have one), with
//	                   metadata val_loss
//	state.safetensors  what --resume reads: the model's tensors again and
//	                   everything else a run needs to continue (optimizer
//	                   state under optim/, ...), with metadata format
//	                   (FormatState), model, config, step, run (the
//	                   driver's settings: --log-every, --precision,
//	                   --graph), best_val_loss, pending_eval
//	metrics.jsonl      the JSON lines of stdout
//	loss.png           the plot of metrics.jsonl
//
// Each file is written atomically (libgpu/ckpt: a temporary file renamed
// over it), the state file first: it alone is what a resumed run reads,
// so a run stopped between two renames resumes from the newer state, and
// the model file catches up at the next checkpoint.
const (
	ModelFile   = "model.safetensors"
	StateFile   = "state.safetensors"
	BestFile    = "best.safetensors"
	MetricsFile = "metrics.jsonl"
	PlotFile    = "loss.png"

	FormatModel = "gpukit.trainer/1"
	FormatState = "gpukit.trainer.state/1"
)

// Metadata keys.
const (
	MetaFormat  = "format"
	MetaModel   = "model"
	MetaConfig  = "config"
	MetaStep    = "step"
	MetaValLoss = "val_loss"
	metaRun     = "run"
	metaBest    = "best_val_loss"
	metaPending = "pending_eval"
)

// Settings are the driver's flags of a run that a resumed run keeps
// unless given again.
type Settings struct {
	LogEvery  int    `json:"log_every"`
	Precision string `json:"precision,omitempty"`
	Graph     string `json:"graph,omitempty"`
}

// Resume is a run read back from its state file for --resume.
type Resume struct {
	Path     string     // the state file
	File     *ckpt.File // its tensors, for Trainer.Load
	Model    string     // the model's name
	Stored   Stored
	Settings Settings
	Best     float64 // the lowest validation loss so far (NaN: none)
	Pending  bool    // the evaluation of the last step is still to run
}

// ReadResume reads the state file of the run directory dir.
func ReadResume(dir string) (*Resume, error) {
	p := filepath.Join(dir, StateFile)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, ModelFile)); err == nil {
			return nil, fmt.Errorf("%s has no %s (written by a trainer from before the state file, or at no checkpoint yet): it cannot be resumed", dir, StateFile)
		}
		return nil, fmt.Errorf("%s holds no run (no %s)", dir, StateFile)
	}
	f, err := ckpt.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := f.Metadata
	if m[MetaFormat] != FormatState {
		return nil, fmt.Errorf("%s: %w: format %q, want %q", p, ErrCheckpoint, m[MetaFormat], FormatState)
	}
	r := &Resume{Path: p, File: f, Model: m[MetaModel], Best: math.NaN(), Pending: m[metaPending] == "1",
		Stored: Stored{Config: json.RawMessage(m[MetaConfig]), Meta: m}}
	if r.Stored.Step, err = strconv.Atoi(m[MetaStep]); err != nil || r.Stored.Step < 0 {
		return nil, fmt.Errorf("%s: %w: step %q", p, ErrCheckpoint, m[MetaStep])
	}
	if err := json.Unmarshal([]byte(m[metaRun]), &r.Settings); err != nil {
		return nil, fmt.Errorf("%s: %w: run settings: %v", p, ErrCheckpoint, err)
	}
	if s, ok := m[metaBest]; ok {
		if r.Best, err = strconv.ParseFloat(s, 64); err != nil {
			return nil, fmt.Errorf("%s: %w: %s %q", p, ErrCheckpoint, metaBest, s)
		}
	}
	// best.safetensors may be newer than the state (written first, then
	// the run stopped): its loss is the one to beat.
	if h, err := ReadHeader(filepath.Join(dir, BestFile)); err == nil {
		if v, err := strconv.ParseFloat(h.Metadata[MetaValLoss], 64); err == nil && !(v >= r.Best) {
			r.Best = v
		}
	}
	return r, nil
}

// Resumable reports whether dir holds a run --resume can continue.
func Resumable(dir string) bool {
	h, err := ReadHeader(filepath.Join(dir, StateFile))
	return err == nil && h.Metadata[MetaFormat] == FormatState
}

// ReadHeader reads the header of the safetensors file at path (not its
// tensors): its names, shapes and metadata.
func ReadHeader(path string) (*ckpt.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ckpt.ErrCorrupt, err)
	}
	size := binary.LittleEndian.Uint64(n[:])
	if size > ckpt.MaxHeader {
		return nil, fmt.Errorf("%s: %w: header length %d", path, ckpt.ErrCorrupt, size)
	}
	b := make([]byte, 8+size)
	copy(b, n[:])
	if _, err := io.ReadFull(f, b[8:]); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ckpt.ErrCorrupt, err)
	}
	h, err := ckpt.DecodeHeader(b, -1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// ModelOf is the registered model whose checkpoint h is: by its metadata
// "model", else the model whose Foreign claims it.
func ModelOf(h *ckpt.Header) (Model, bool) {
	if name, ok := h.Metadata[MetaModel]; ok {
		return Lookup(name)
	}
	for _, m := range Models() {
		if m.Foreign != nil && m.Foreign(h) {
			return m, true
		}
	}
	return Model{}, false
}

// Resolve is the checkpoint file --ckpt names: a file as it is, or, for a
// run directory, its best.safetensors when it has one (the lowest
// validation loss) and its model.safetensors otherwise. which says which
// for the command's human line ("" for a file named directly).
func Resolve(path string) (file, which string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", err
	}
	if !st.IsDir() {
		return path, "", nil
	}
	best := filepath.Join(path, BestFile)
	if h, err := ReadHeader(best); err == nil {
		return best, fmt.Sprintf("the checkpoint of the lowest validation loss (%s at step %s)", h.Metadata[MetaValLoss], h.Metadata[MetaStep]), nil
	}
	model := filepath.Join(path, ModelFile)
	if _, err := os.Stat(model); err != nil {
		return "", "", fmt.Errorf("%s holds neither %s nor %s", path, BestFile, ModelFile)
	}
	return model, "the last checkpoint (the run has no best.safetensors)", nil
}

// written are the files a run writes atomically (libgpu/atomicfile,
// through libgpu/ckpt.WriteFile and the plot); a SIGKILL mid-write leaves
// their temporary files (atomicfile.Litter), which a run that starts or
// resumes in the directory removes (RemoveLitter).
var written = []string{ModelFile, StateFile, BestFile, PlotFile}

// RemoveLitter removes the temporary files killed writes left in dir and
// returns their names.
func RemoveLitter(dir string) ([]string, error) {
	var removed []string
	for _, f := range written {
		ms, err := atomicfile.Litter(filepath.Join(dir, f))
		if err != nil {
			return removed, err
		}
		for _, m := range ms {
			if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return removed, err
			}
			removed = append(removed, filepath.Base(m))
		}
	}
	return removed, nil
}

// ckptWriter writes a run's checkpoint files.
type ckptWriter struct {
	dir      string
	model    string // the model's name
	config   []byte // its configuration (JSON)
	settings Settings
	best     float64 // lowest validation loss so far (NaN: none)
}

// meta is the metadata every file of the checkpoint after step has.
func (w *ckptWriter) meta(format string, step int, extra ...map[string]string) map[string]string {
	m := map[string]string{MetaFormat: format, MetaModel: w.model, MetaConfig: string(w.config), MetaStep: strconv.Itoa(step)}
	for _, e := range extra {
		for k, v := range e {
			m[k] = v
		}
	}
	return m
}

// save writes the state file, then the model file, of the checkpoint
// after step (pending: that step's evaluation has not run).
func (w *ckptWriter) save(ck Checkpoint, step int, pending bool) error {
	sm := w.meta(FormatState, step, ck.Meta, ck.StateMeta)
	run, err := json.Marshal(w.settings)
	if err != nil {
		return err
	}
	sm[metaRun] = string(run)
	if !math.IsNaN(w.best) {
		sm[metaBest] = strconv.FormatFloat(w.best, 'g', -1, 64)
	}
	if pending {
		sm[metaPending] = "1"
	}
	state := append(append([]ckpt.Entry(nil), ck.Model...), ck.State...)
	if err := ckpt.WriteFile(filepath.Join(w.dir, StateFile), state, sm); err != nil {
		return fmt.Errorf("writing the checkpoint: %w", err)
	}
	if err := ckpt.WriteFile(filepath.Join(w.dir, ModelFile), ck.Model, w.meta(FormatModel, step, ck.Meta)); err != nil {
		return fmt.Errorf("writing the checkpoint: %w", err)
	}
	return nil
}

// saveBest writes best.safetensors when loss is below the best so far,
// and reports whether it did.
func (w *ckptWriter) saveBest(ck Checkpoint, step int, loss float64) (bool, error) {
	if math.IsNaN(loss) || loss >= w.best {
		return false, nil
	}
	m := w.meta(FormatModel, step, ck.Meta)
	m[MetaValLoss] = strconv.FormatFloat(loss, 'g', -1, 64)
	if err := ckpt.WriteFile(filepath.Join(w.dir, BestFile), ck.Model, m); err != nil {
		return false, fmt.Errorf("writing the best checkpoint: %w", err)
	}
	w.best = loss
	return true, nil
}

// WriteInit writes the initial weights of a model (Task.Init) to path in
// model.safetensors's format, at step 0.
func WriteInit(path, model string, config any, ck Checkpoint) error {
	cb, err := json.Marshal(config)
	if err != nil {
		return err
	}
	w := &ckptWriter{model: model, config: cb}
	if err := ckpt.WriteFile(path, ck.Model, w.meta(FormatModel, 0, ck.Meta)); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
