package chrome

import (
	"errors"
	"fmt"
	"gpukit/libgpu/atomicfile"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

const (
	head = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
	tail = "\n]}\n"
)

// flushPiece is the most bytes of events Flush writes at once.
const flushPiece = 64 << 10

// ErrClosed is returned by a closed Writer.
var ErrClosed = errors.New("chrome: writer closed")

// Writer appends events to a trace file that is valid JSON after every
// Flush, and after any stop of the process:
//
//   - each Flush writes the buffered events (whole events only) followed
//     by the closing "]}", in pieces of about 64 KiB, each one pwrite at
//     the offset where the previous closing began, and after each tells
//     the closer (below) the new end;
//   - a write that fails (a full disk, a quota, a size limit) is undone:
//     the file is cut back to the last end written whole and closed again
//     there, and the Writer stops writing (Err says why; the events it
//     could not write are counted, Lost). The file keeps what was valid;
//   - a pwrite cut short by SIGKILL leaves part of a flush behind the last
//     closing: the closer, a small child process started by Create that
//     holds the file open and reads each committed end from a pipe, sees
//     the pipe close without a clean Close, cuts the file back to the
//     last committed end and writes the closing there. It ignores SIGINT,
//     SIGTERM and SIGHUP and runs in a process group of its own, so a
//     terminal's Ctrl-C or a kill of the collector's group leaves it to do
//     its work; only a SIGKILL of both (a whole cgroup at once) during a
//     write can leave a cut file.
//
// It is not safe for concurrent use.
type Writer struct {
	f        *os.File
	path     string // as the caller named it: errors say this, never the temporary name
	end      int64  // offset of the closing tail: everything before it is written whole
	max      int64  // size cap in bytes (0: none)
	buf      []byte
	starts   []int  // where each event in buf begins (its separator, if any)
	piece    []byte // scratch: one piece of buf and the closing
	nbuf     uint64 // events in buf
	events   uint64 // events accepted (written or buffered)
	written  uint64 // events in the file
	capped   uint64 // events refused by the size cap
	lost     uint64 // events not written because writing failed
	failed   error  // the write failure that stopped the Writer
	syncGap  time.Duration
	lastSync time.Time
	closer   *closer
	closed   bool
}

// Create writes an empty trace to a new file beside path and renames it to
// path, so an existing file at path is replaced whole, never truncated or
// written over (a reader holding it open keeps the old trace, and a start
// that fails before the rename leaves it alone). maxSize caps the file in
// bytes (0: no cap); events that would pass it are refused and counted
// (Capped). The file is fsynced at most every syncEvery (0: 1 s) during
// Flush, and at Close. The closer is started before the rename (Guarded
// says whether it runs).
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
			return nil, fmt.Errorf("chrome: %s: %w", path, atomicfile.PlainErr(err))
		}
	}
	if f == nil {
		return nil, fmt.Errorf("chrome: no free temporary name beside %s", path)
	}
	if syncEvery <= 0 {
		syncEvery = time.Second
	}
	w := &Writer{f: f, path: path, max: maxSize, syncGap: syncEvery, lastSync: time.Now(), end: int64(len(head))}
	_, err := f.WriteAt([]byte(head+tail), 0)
	if err == nil {
		w.closer = startCloser(f, w.end)
		err = os.Rename(tmp, path)
	}
	if err != nil {
		w.closer.stop()
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("chrome: %s: %w", path, atomicfile.PlainErr(err))
	}
	return w, nil
}

// Add buffers one encoded event (a JSON object); false when the size cap
// refused it or the Writer has stopped (a failed write, Close).
func (w *Writer) Add(ev []byte) bool {
	if w.closed {
		return false
	}
	if w.failed != nil {
		w.lost++
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
	w.starts = append(w.starts, len(w.buf))
	if sep != 0 {
		w.buf = append(w.buf, ",\n"...)
	}
	w.buf = append(w.buf, ev...)
	w.events++
	w.nbuf++
	return true
}

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return len(w.buf) }

// Events is the number of events accepted so far (written or buffered).
func (w *Writer) Events() uint64 { return w.events }

// Written is the number of events in the file (after the last Flush).
func (w *Writer) Written() uint64 { return w.written }

// Capped is the number of events the size cap refused.
func (w *Writer) Capped() uint64 { return w.capped }

// Lost is the number of events accepted or offered after a write failed,
// which the file does not hold.
func (w *Writer) Lost() uint64 { return w.lost }

// Err is the write failure that stopped the Writer, or nil.
func (w *Writer) Err() error { return w.failed }

// Guarded reports whether the closer runs (the file is closed again after
// a SIGKILL of this process).
func (w *Writer) Guarded() bool { return w.closer != nil }

// Size is the current file size in bytes (after the last Flush).
func (w *Writer) Size() int64 { return w.end + int64(len(tail)) }

// Flush writes the buffered events and the closing brackets in one write,
// and fsyncs when the last sync is older than the sync interval. A failed
// write stops the Writer (see Writer); Flush returns that error once.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if w.failed != nil {
		return nil
	}
	// Pieces of at most flushPiece bytes of whole events, each written
	// with the closing behind it and committed: on a full disk the
	// pieces that fit are kept.
	for first := 0; first < len(w.starts); {
		last := first + 1
		for last < len(w.starts) && w.starts[last]-w.starts[first] < flushPiece {
			last++
		}
		from, to := w.starts[first], len(w.buf)
		if last < len(w.starts) {
			to = w.starts[last]
		}
		w.piece = append(append(w.piece[:0], w.buf[from:to]...), tail...)
		piece := w.piece
		n, err := w.f.WriteAt(piece, w.end)
		if err == nil && n != len(piece) {
			err = fmt.Errorf("short write: %d of %d bytes", n, len(piece))
		}
		if err != nil {
			return w.fail("write", err)
		}
		w.end += int64(to - from)
		w.written += uint64(last - first)
		w.nbuf -= uint64(last - first)
		w.closer.commit(w.end)
		first = last
	}
	w.buf, w.starts, w.nbuf = w.buf[:0], w.starts[:0], 0
	if time.Since(w.lastSync) >= w.syncGap {
		w.lastSync = time.Now()
		if err := w.f.Sync(); err != nil {
			return w.fail("sync", err)
		}
	}
	return nil
}

// fail stops the Writer after a failed write or sync: the file is cut back
// to the last end written whole and closed there (a rewrite of bytes the
// file already holds, which needs no new space), and the events not
// written are counted as lost.
func (w *Writer) fail(what string, err error) error {
	w.lost += w.nbuf
	w.buf, w.starts, w.nbuf = nil, nil, 0
	restore := closeAt(w.f, w.end)
	w.failed = fmt.Errorf("chrome: %s %s: %w; stopped writing there, the file keeps its first %d events", what, w.path, atomicfile.PlainErr(err), w.written)
	if restore != nil {
		w.failed = fmt.Errorf("%w (and closing it again failed: %v)", w.failed, atomicfile.PlainErr(restore))
	}
	return w.failed
}

// closeAt cuts f to end and writes the closing there: the file is then
// the valid trace of the events before end. The bytes rewritten were
// written before (the closing was at end), so a full disk does not stop
// it.
func closeAt(f *os.File, end int64) error {
	if err := f.Truncate(end + int64(len(tail))); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(tail), end); err != nil {
		return err
	}
	return f.Sync()
}

// Close flushes, fsyncs and closes the file, and lets the closer go. It
// returns the write failure that stopped the Writer, if any.
func (w *Writer) Close() error {
	if w.closed {
		return ErrClosed
	}
	err := w.Flush()
	w.closed = true
	if w.failed != nil {
		err = w.failed
	}
	if serr := w.f.Sync(); err == nil && serr != nil {
		err = fmt.Errorf("chrome: sync %s: %w", w.path, atomicfile.PlainErr(serr))
	}
	w.closer.done()
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("chrome: close %s: %w", w.path, atomicfile.PlainErr(cerr))
	}
	return err
}
