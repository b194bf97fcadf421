package data

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// IDX magic numbers (LeCun's MNIST page): unsigned-byte elements, 3 and 1
// dimensions.
const (
	MagicImages = 0x00000803 // 2051: [N, rows, cols] uint8
	MagicLabels = 0x00000801 // 2049: [N] uint8
)

// maxIDXElems bounds the element count a header may announce (1 GiB of
// bytes), so a corrupt header cannot make the reader allocate without limit.
const maxIDXElems = 1 << 30

// Errors.
var (
	ErrFormat    = errors.New("data: not a valid IDX file")
	ErrTruncated = errors.New("data: file is truncated")
	ErrMismatch  = errors.New("data: images and labels disagree")
	ErrMissing   = errors.New("data: dataset file not found")
)

// IDXHeader is a decoded IDX header.
type IDXHeader struct {
	Magic uint32 // the whole magic word (e.g. 2051)
	Type  byte   // element type code; 0x08 is the only one accepted (uint8)
	Dims  []int  // sizes, outermost first
}

// Len is the number of elements the header announces.
func (h IDXHeader) Len() int {
	n := 1
	for _, d := range h.Dims {
		n *= d
	}
	return n
}

// Size is the header's length in bytes: 4 + 4·len(Dims).
func (h IDXHeader) Size() int { return 4 + 4*len(h.Dims) }

// DecodeIDXHeader decodes the header at the start of b. It accepts only
// unsigned-byte elements (type 0x08), 1 to 4 dimensions, each at least 1,
// whose product is at most 2³⁰. It errors with ErrFormat on a bad magic or
// dimension and ErrTruncated when b ends inside the header.
func DecodeIDXHeader(b []byte) (IDXHeader, error) {
	if len(b) < 4 {
		return IDXHeader{}, fmt.Errorf("%w: %d header bytes, need 4", ErrTruncated, len(b))
	}
	magic := binary.BigEndian.Uint32(b)
	h := IDXHeader{Magic: magic, Type: b[2]}
	if b[0] != 0 || b[1] != 0 {
		return h, fmt.Errorf("%w: magic %#08x does not start with two zero bytes", ErrFormat, magic)
	}
	if h.Type != 0x08 {
		return h, fmt.Errorf("%w: element type %#02x, want 0x08 (unsigned byte)", ErrFormat, h.Type)
	}
	nd := int(b[3])
	if nd < 1 || nd > 4 {
		return h, fmt.Errorf("%w: %d dimensions, want 1 to 4", ErrFormat, nd)
	}
	if len(b) < 4+4*nd {
		return h, fmt.Errorf("%w: %d header bytes, need %d", ErrTruncated, len(b), 4+4*nd)
	}
	total := int64(1)
	h.Dims = make([]int, nd)
	for i := range nd {
		d := int64(binary.BigEndian.Uint32(b[4+4*i:]))
		if d < 1 {
			return h, fmt.Errorf("%w: dimension %d is 0", ErrFormat, i)
		}
		total *= d
		if total > maxIDXElems {
			return h, fmt.Errorf("%w: more than %d elements", ErrFormat, maxIDXElems)
		}
		h.Dims[i] = int(d)
	}
	return h, nil
}

// ReadIDX reads a whole IDX file (gzip'd when it starts with the gzip magic
// 1f 8b) and returns its header and elements. Errors name the file.
func ReadIDX(path string) (IDXHeader, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return IDXHeader{}, nil, fmt.Errorf("%w: %s", ErrMissing, path)
		}
		return IDXHeader{}, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	h, body, err := decodeIDX(bufio.NewReader(f))
	if err != nil {
		return h, nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, body, nil
}

func decodeIDX(br *bufio.Reader) (IDXHeader, []byte, error) {
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return IDXHeader{}, nil, fmt.Errorf("%w: gzip: %v", ErrFormat, err)
		}
		defer zr.Close()
		r = zr
	}
	head := make([]byte, 4, 4+4*4)
	if n, err := io.ReadFull(r, head); err != nil {
		return IDXHeader{}, nil, readErr(err, "header", n, 4)
	}
	nd := int(head[3])
	if nd >= 1 && nd <= 4 {
		head = head[:4+4*nd]
		if n, err := io.ReadFull(r, head[4:]); err != nil {
			return IDXHeader{}, nil, readErr(err, "header", 4+n, len(head))
		}
	}
	h, err := DecodeIDXHeader(head)
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.Len())
	if n, err := io.ReadFull(r, body); err != nil {
		return h, nil, readErr(err, fmt.Sprintf("data of shape %v", h.Dims), n, len(body))
	}
	return h, body, nil
}

func readErr(err error, what string, got, want int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s has %d of %d bytes", ErrTruncated, what, got, want)
	}
	return fmt.Errorf("data: reading %s: %w", what, err)
}
