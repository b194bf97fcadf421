package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"gpukit/libgpu/atomicfile"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"gpukit/libgpu/tensor"
)

// MaxHeader is the largest header accepted (100 MB, the reference
// implementation's limit).
const MaxHeader = 100_000_000

// metadataKey is the reserved header entry for string metadata.
const metadataKey = "__metadata__"

// Errors.
var (
	ErrCorrupt  = errors.New("ckpt: corrupt safetensors file")
	ErrNotFound = errors.New("ckpt: tensor not in checkpoint")
	ErrMismatch = errors.New("ckpt: tensor does not match checkpoint")
)

// Info describes one tensor in a safetensors header.
type Info struct {
	DType tensor.DType
	Shape []int
	Begin int64 // byte offset of the first byte in the data buffer
	End   int64 // one past the last byte
}

// Header is a decoded safetensors header.
type Header struct {
	Tensors  map[string]Info
	Metadata map[string]string
	Size     int64 // bytes of JSON (N), excluding the 8-byte length
}

// Names lists the tensors sorted by name.
func (h *Header) Names() []string {
	names := make([]string, 0, len(h.Tensors))
	for n := range h.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DataSize is the length of the data buffer the header describes.
func (h *Header) DataSize() int64 {
	var n int64
	for _, t := range h.Tensors {
		n = max(n, t.End)
	}
	return n
}

type jsonInfo struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// DecodeHeader decodes and validates a header: b starts with the 8-byte
// length and holds at least that much JSON after it. dataSize is the length
// of the data buffer that follows (the file size − 8 − N), or −1 to skip the
// check that the tensors cover it exactly. Every error wraps ErrCorrupt and
// says what is wrong: bad length, bad JSON, unknown dtype, negative
// dimension, offsets out of order, overlapping, leaving gaps or out of
// bounds, or a byte count that disagrees with dtype and shape.
func DecodeHeader(b []byte, dataSize int64) (*Header, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, need at least 8 for the header length", ErrCorrupt, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n < 2 || n > MaxHeader {
		return nil, fmt.Errorf("%w: header length %d (want 2 to %d)", ErrCorrupt, n, MaxHeader)
	}
	if uint64(len(b)-8) < n {
		return nil, fmt.Errorf("%w: header length %d, only %d bytes follow", ErrCorrupt, n, len(b)-8)
	}
	js := b[8 : 8+n]
	if js[0] != '{' {
		return nil, fmt.Errorf("%w: header does not start with '{'", ErrCorrupt)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(js))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrCorrupt, err)
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimRight(rest, " ")) != 0 {
		return nil, fmt.Errorf("%w: bytes after the header JSON", ErrCorrupt)
	}
	h := &Header{Tensors: make(map[string]Info, len(raw)), Metadata: map[string]string{}, Size: int64(n)}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		if name == metadataKey {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrCorrupt, err)
			}
			if h.Metadata == nil {
				h.Metadata = map[string]string{}
			}
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("%w: empty tensor name", ErrCorrupt)
		}
		var ji jsonInfo
		d := json.NewDecoder(bytes.NewReader(msg))
		d.DisallowUnknownFields()
		if err := d.Decode(&ji); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrCorrupt, name, err)
		}
		dt, err := tensor.ParseDType(ji.DType)
		if err != nil || ji.DType != dt.SafetensorsName() {
			return nil, fmt.Errorf("%w: tensor %q: dtype %q is not one of F32, BF16, F16, I32, I64, U8", ErrCorrupt, name, ji.DType)
		}
		if ji.Shape == nil || len(ji.DataOffsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q needs a shape and two data_offsets", ErrCorrupt, name)
		}
		elems := int64(1)
		shape := make([]int, len(ji.Shape))
		for i, s := range ji.Shape {
			if s < 0 || s > math.MaxInt32 {
				return nil, fmt.Errorf("%w: tensor %q: dimension %d is %d", ErrCorrupt, name, i, s)
			}
			if s != 0 && elems > math.MaxInt64/int64(dt.Size())/s {
				return nil, fmt.Errorf("%w: tensor %q: shape %v overflows", ErrCorrupt, name, ji.Shape)
			}
			elems *= s
			shape[i] = int(s)
		}
		begin, end := ji.DataOffsets[0], ji.DataOffsets[1]
		if begin < 0 || end < begin {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d]", ErrCorrupt, name, begin, end)
		}
		if want := elems * int64(dt.Size()); end-begin != want {
			return nil, fmt.Errorf("%w: tensor %q: %v %v needs %d bytes, data_offsets give %d", ErrCorrupt, name, dt.SafetensorsName(), shape, want, end-begin)
		}
		if dataSize >= 0 && end > dataSize {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] past the %d-byte data buffer", ErrCorrupt, name, begin, end, dataSize)
		}
		h.Tensors[name] = Info{DType: dt, Shape: shape, Begin: begin, End: end}
		spans = append(spans, span{name, begin, end})
	}
	// The ranges must tile [0, dataSize) in some order: sorted by begin, each
	// starts where the previous ended.
	slices.SortFunc(spans, func(a, b span) int {
		if a.begin != b.begin {
			return int(min(max(a.begin-b.begin, -1), 1))
		}
		return int(min(max(a.end-b.end, -1), 1))
	})
	var at int64
	for _, s := range spans {
		if s.begin != at {
			if s.begin < at {
				return nil, fmt.Errorf("%w: tensor %q at [%d, %d] overlaps the previous tensor (ends at %d)", ErrCorrupt, s.name, s.begin, s.end, at)
			}
			return nil, fmt.Errorf("%w: gap of %d bytes before tensor %q", ErrCorrupt, s.begin-at, s.name)
		}
		at = s.end
	}
	if dataSize >= 0 && at != dataSize {
		return nil, fmt.Errorf("%w: tensors cover %d bytes, data buffer has %d", ErrCorrupt, at, dataSize)
	}
	return h, nil
}

// Entry is one tensor to encode: its safetensors dtype and shape, and its
// raw little-endian bytes (Numel·DType.Size() of them).
type Entry struct {
	Name  string
	DType tensor.DType
	Shape []int
	Data  []byte
}

// Encode writes a safetensors file to w: entries sorted by name and laid out
// contiguously, the header padded with spaces to a multiple of 8 bytes.
// It errors on duplicate or empty names, the reserved name "__metadata__",
// unknown dtypes and data lengths that disagree with dtype and shape.
func Encode(w io.Writer, entries []Entry, meta map[string]string) error {
	es := slices.Clone(entries)
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	hdr := make(map[string]any, len(es)+1)
	var off int64
	for i, e := range es {
		if e.Name == "" || e.Name == metadataKey {
			return fmt.Errorf("ckpt: bad tensor name %q", e.Name)
		}
		if i > 0 && es[i-1].Name == e.Name {
			return fmt.Errorf("ckpt: tensor %q given twice", e.Name)
		}
		if e.DType.Size() == 0 {
			return fmt.Errorf("ckpt: tensor %q: %w: %v", e.Name, tensor.ErrDType, e.DType)
		}
		if want := tensor.Numel(e.Shape) * e.DType.Size(); len(e.Data) != want {
			return fmt.Errorf("ckpt: tensor %q: %v %v needs %d bytes, got %d", e.Name, e.DType, e.Shape, want, len(e.Data))
		}
		shape := e.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[e.Name] = map[string]any{"dtype": e.DType.SafetensorsName(), "shape": shape, "data_offsets": []int64{off, off + int64(len(e.Data))}}
		off += int64(len(e.Data))
	}
	if len(meta) > 0 {
		hdr[metadataKey] = meta
	}
	js, err := json.Marshal(hdr) // map keys come out sorted
	if err != nil {
		return fmt.Errorf("ckpt: header: %w", err)
	}
	pad := (8 - len(js)%8) % 8
	js = append(js, bytes.Repeat([]byte{' '}, pad)...)
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(len(js)))
	if _, err := w.Write(lenb[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, e := range es {
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
	}
	return nil
}

// File is a decoded safetensors file held in memory.
type File struct {
	Header
	data []byte
}

// Decode decodes and validates a whole safetensors file held in b.
func Decode(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, need at least 8", ErrCorrupt, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%w: header length %d, file has %d bytes after it", ErrCorrupt, n, len(b)-8)
	}
	h, err := DecodeHeader(b, int64(uint64(len(b)-8)-n))
	if err != nil {
		return nil, err
	}
	return &File{Header: *h, data: b[8+h.Size:]}, nil
}

// ReadFile reads and validates the safetensors file at path; errors name it.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	f, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Bytes is the raw data of the named tensor (aliasing the file's memory).
func (f *File) Bytes(name string) (Info, []byte, error) {
	in, ok := f.Tensors[name]
	if !ok {
		return Info{}, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return in, f.data[in.Begin:in.End], nil
}

// Load copies the named tensor into t (on any device, through Tensor.Write).
// dtype and shape must match exactly (ErrMismatch).
func (f *File) Load(name string, t *tensor.Tensor) error {
	in, b, err := f.Bytes(name)
	if err != nil {
		return err
	}
	if in.DType != t.DType || !tensor.SameShape(in.Shape, t.Shape) {
		return fmt.Errorf("%w: %q is %v %v in the file, %v %v in the model", ErrMismatch, name, in.DType, in.Shape, t.DType, t.Shape)
	}
	if err := t.Write(b); err != nil {
		return fmt.Errorf("ckpt: loading %q: %w", name, err)
	}
	return nil
}

// Named is a tensor with the name it is saved under.
type Named struct {
	Name string
	T    *tensor.Tensor
}

// Save writes tensors (read from any device with Tensor.Read) and metadata to
// path atomically (mode 0644): into a temporary file in the same directory, fsynced,
// renamed over path, then the directory fsynced, so a crash leaves either
// the old file or the new one.
func Save(path string, tensors []Named, meta map[string]string) error {
	entries := make([]Entry, len(tensors))
	for i, nt := range tensors {
		b, err := nt.T.Read()
		if err != nil {
			return fmt.Errorf("ckpt: reading %q: %w", nt.Name, err)
		}
		entries[i] = Entry{Name: nt.Name, DType: nt.T.DType, Shape: nt.T.Shape, Data: b}
	}
	return WriteFile(path, entries, meta)
}

// WriteFile encodes entries and metadata to path atomically (see Save),
// synced to stable storage (libgpu/atomicfile). Errors name path, never
// the temporary file (which is removed).
func WriteFile(path string, entries []Entry, meta map[string]string) error {
	var encErr error // an encoding error (not an I/O one) is passed on as it is
	err := atomicfile.Write(path, atomicfile.Options{Sync: true}, func(w io.Writer) error {
		if err := Encode(&errWriter{w: w}, entries, meta); err != nil {
			if !errors.Is(err, errWrite) {
				encErr = err
			}
			return err
		}
		return nil
	})
	if encErr != nil {
		return encErr
	}
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	return nil
}

// errWrite marks a failed write of the file.
var errWrite = errors.New("write")

type errWriter struct{ w io.Writer }

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		return n, fmt.Errorf("%w: %w", errWrite, atomicfile.PlainErr(err))
	}
	return n, nil
}
