package chrome

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

const (
	head = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
	tail = "\n]}\n"
)

// ErrClosed is returned by a closed Writer.
var ErrClosed = errors.New("chrome: writer closed")

// Writer appends events to a trace file that is valid JSON after every
// Flush: each Flush writes the buffered events followed by the closing "]}"
// in one pwrite at the offset where the previous closing began. It is not
// safe for concurrent use.
type Writer struct {
	f        *os.File
	end      int64 // offset of the closing tail
	max      int64 // size cap in bytes (0: none)
	buf      []byte
	events   uint64 // events written or buffered
	capped   uint64 // events refused by the size cap
	syncGap  time.Duration
	lastSync time.Time
	closed   bool
}

// Create writes an empty trace to a new file beside path and renames it to
// path, so an existing file at path is replaced whole, never truncated or
// written over (a reader holding it open keeps the old trace, and a start
// that fails before the rename leaves it alone). maxSize caps the file in
// bytes (0: no cap); events that would pass it are refused and counted
// (Capped). The file is fsynced at most every syncEvery (0: 1 s) during
// Flush, and at Close.
func Create(path string, maxSize int64, syncEvery time.Duration) (*Writer, error) {
	if maxSize != 0 && maxSize < int64(len(head)+len(tail)) {
		return nil, fmt.Errorf("chrome: size cap %d bytes is too small", maxSize)
	}
	dir, base := filepath.Split(path)
	var f *os.File
	var tmp string
	for range 100 {
		tmp = filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", base, rand.Uint32()))
		var err error
		f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("chrome: %s: %w", path, plainErr(err))
		}
	}
	if f == nil {
		return nil, fmt.Errorf("chrome: no free temporary name beside %s", path)
	}
	if syncEvery <= 0 {
		syncEvery = time.Second
	}
	w := &Writer{f: f, max: maxSize, syncGap: syncEvery, lastSync: time.Now(), end: int64(len(head))}
	_, err := f.WriteAt([]byte(head+tail), 0)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("chrome: %s: %w", path, plainErr(err))
	}
	return w, nil
}

// plainErr drops the file names an *fs.PathError or *os.LinkError carries
// (the temporary file's: errors name the file asked for), keeping the cause.
func plainErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// Add buffers one encoded event (a JSON object); false when the size cap
// refused it.
func (w *Writer) Add(ev []byte) bool {
	if w.closed {
		return false
	}
	sep := 2 // ",\n"
	if w.events == 0 {
		sep = 0
	}
	if w.max > 0 && w.end+int64(len(w.buf)+sep+len(ev)+len(tail)) > w.max {
		w.capped++
		return false
	}
	if sep != 0 {
		w.buf = append(w.buf, ",\n"...)
	}
	w.buf = append(w.buf, ev...)
	w.events++
	return true
}

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return len(w.buf) }

// Events is the number of events accepted so far.
func (w *Writer) Events() uint64 { return w.events }

// Capped is the number of events the size cap refused.
func (w *Writer) Capped() uint64 { return w.capped }

// Size is the current file size in bytes (after the last Flush).
func (w *Writer) Size() int64 { return w.end + int64(len(tail)) }

// Flush writes the buffered events and the closing brackets in one write,
// and fsyncs when the last sync is older than the sync interval.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if len(w.buf) > 0 {
		w.buf = append(w.buf, tail...)
		if _, err := w.f.WriteAt(w.buf, w.end); err != nil {
			return fmt.Errorf("chrome: write: %w", err)
		}
		w.end += int64(len(w.buf) - len(tail))
		w.buf = w.buf[:0]
	}
	if time.Since(w.lastSync) >= w.syncGap {
		w.lastSync = time.Now()
		if err := w.f.Sync(); err != nil {
			return fmt.Errorf("chrome: sync: %w", err)
		}
	}
	return nil
}

// Close flushes, fsyncs and closes the file.
func (w *Writer) Close() error {
	if w.closed {
		return ErrClosed
	}
	err := w.Flush()
	w.closed = true
	if serr := w.f.Sync(); err == nil && serr != nil {
		err = fmt.Errorf("chrome: sync: %w", serr)
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("chrome: close: %w", cerr)
	}
	return err
}
