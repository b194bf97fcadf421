package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

func randTensor(t *testing.T, rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.Alloc(device.Local{Dev: device.NewHost()}, "", dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, x.Bytes())
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	if err := x.Write(b); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestSaveLoadExact(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	dts := []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64, tensor.U8}
	var named []Named
	for i, dt := range dts {
		shape := []int{1 + rng.IntN(5), 1 + rng.IntN(7)}
		if i == 3 {
			shape = []int{} // scalar
		}
		if i == 4 {
			shape = []int{0, 3} // empty
		}
		named = append(named, Named{Name: string(rune('z'-i)) + "/" + dt.String(), T: randTensor(t, rng, dt, shape...)})
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	meta := map[string]string{"step": "12", "config": `{"a":[1,2]}`}
	if err := Save(path, named, meta); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	n := binary.LittleEndian.Uint64(raw)
	if n%8 != 0 {
		t.Fatalf("header length %d not a multiple of 8", n)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["step"] != "12" || f.Metadata["config"] != meta["config"] || len(f.Metadata) != 2 {
		t.Fatalf("metadata %v", f.Metadata)
	}
	// Sorted by name, contiguous from 0.
	var at int64
	for _, name := range f.Names() {
		in := f.Tensors[name]
		if in.Begin != at {
			t.Fatalf("%s starts at %d, want %d", name, in.Begin, at)
		}
		at = in.End
	}
	for _, nt := range named {
		back := randTensor(t, rng, nt.T.DType, nt.T.Shape...)
		if err := f.Load(nt.Name, back); err != nil {
			t.Fatal(err)
		}
		a, _ := nt.T.Read()
		b, _ := back.Read()
		if !bytes.Equal(a, b) {
			t.Fatalf("%s differs after round trip", nt.Name)
		}
	}
	// One more row than the stored tensor: never its shape (a fixed [2, 2]
	// was, for one random shape in 35).
	sh := named[0].T.Shape
	wrong := randTensor(t, rng, tensor.F32, sh[0]+1, sh[1])
	if err := f.Load(named[0].Name, wrong); !errors.Is(err, ErrMismatch) {
		t.Fatalf("shape mismatch: %v", err)
	}
	if err := f.Load("nope", wrong); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	// No temporary files left behind.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries", len(ents))
	}
}

// file builds a safetensors file from a literal header and data length.
func file(header string, data int) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(make([]byte, data))
	return b.Bytes()
}

func TestDecodeCorrupt(t *testing.T) {
	good := file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}`, 11)
	if f, err := Decode(good); err != nil || len(f.Tensors) != 2 {
		t.Fatalf("good file: %v", err)
	}
	cases := map[string][]byte{
		"short":        {1, 2, 3},
		"huge header":  append(binary.LittleEndian.AppendUint64(nil, 1<<40), '{', '}'),
		"truncated":    good[:len(good)-1],
		"trailing":     append(bytes.Clone(good), 0),
		"bad json":     file(`{"a":`, 0),
		"not object":   file(`[1,2]`, 0),
		"bad dtype":    file(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, 8),
		"lower dtype":  file(`{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, 4),
		"size":         file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8),
		"neg dim":      file(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, 0),
		"reversed":     file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4),
		"out of bound": file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}`, 6),
		"gap":          file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`, 4),
		"overlap":      file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`, 4),
		"one offset":   file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[4]}}`, 4),
		"extra field":  file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1),
		"meta numbers": file(`{"__metadata__":{"a":1}}`, 0),
		"overflow":     file(`{"a":{"dtype":"I64","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,8]}}`, 8),
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	path := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(path, cases["gap"], 0o644)
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name the file: %v", err)
	}
}

func TestEncodeRejects(t *testing.T) {
	var buf bytes.Buffer
	for _, es := range [][]Entry{
		{{Name: "a", DType: tensor.F32, Shape: []int{2}, Data: make([]byte, 7)}},
		{{Name: "a", DType: tensor.U8, Shape: []int{1}, Data: []byte{1}}, {Name: "a", DType: tensor.U8, Shape: []int{1}, Data: []byte{1}}},
		{{Name: "__metadata__", DType: tensor.U8, Shape: []int{1}, Data: []byte{1}}},
		{{Name: "a", DType: 0, Shape: []int{1}, Data: []byte{1}}},
	} {
		if err := Encode(&buf, es, nil); err == nil {
			t.Fatalf("accepted %+v", es)
		}
	}
}

func FuzzDecode(f *testing.F) {
	var b bytes.Buffer
	Encode(&b, []Entry{{Name: "w", DType: tensor.F32, Shape: []int{2, 1}, Data: make([]byte, 8)}, {Name: "s", DType: tensor.I32, Shape: []int{}, Data: make([]byte, 4)}}, map[string]string{"k": "v"})
	f.Add(b.Bytes())
	f.Add(file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`, 4))
	f.Add(file(`{}      `, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// Whatever decodes re-encodes to a file that decodes to the same tensors.
		var es []Entry
		for _, name := range fl.Names() {
			in, data, err := fl.Bytes(name)
			if err != nil {
				t.Fatal(err)
			}
			es = append(es, Entry{Name: name, DType: in.DType, Shape: in.Shape, Data: data})
		}
		var out bytes.Buffer
		if err := Encode(&out, es, fl.Metadata); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := Decode(out.Bytes())
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		for _, e := range es {
			_, d, err := again.Bytes(e.Name)
			if err != nil || !bytes.Equal(d, e.Data) {
				t.Fatalf("%q changed: %v", e.Name, err)
			}
		}
		m1, _ := json.Marshal(fl.Metadata)
		m2, _ := json.Marshal(again.Metadata)
		if !bytes.Equal(m1, m2) {
			t.Fatalf("metadata changed: %s vs %s", m1, m2)
		}
	})
}

// TestWriteFileErrorsNameThePath: a failed write names the file asked
// for, never the temporary file beside it, and keeps the cause.
func TestWriteFileErrorsNameThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "s.safetensors")
	err := WriteFile(path, []Entry{{Name: "x", DType: tensor.F32, Shape: []int{1}, Data: make([]byte, 4)}}, nil)
	if err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), ".tmp") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WriteFile into a missing directory: %v", err)
	}
}

// TestWriteFileErrorsNamePath: a write that fails (here the rename over
// a directory of the same name) reports the path asked for, never the
// temporary file it wrote first, and leaves no temporary file behind.
func TestWriteFileErrorsNamePath(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.safetensors")
	if err := os.MkdirAll(filepath.Join(p, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(p, []Entry{{Name: "x", DType: tensor.F32, Shape: []int{1}, Data: make([]byte, 4)}}, nil)
	if err == nil || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), ".tmp") {
		t.Fatalf("error %v: want one naming %s and no temporary file", err, p)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("the failed write left %d entries in %s", len(ents), dir)
	}
}
