package app

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/pool"
)

// put and get move a buffer's bytes chunk by chunk, so their memory stays
// bounded whatever the buffer's size (issue 11, item 12). On a host pool
// they read and write the slab's memfd with pread/pwrite instead of
// touching the mapping: reading a hole through a shared mapping would
// allocate a page for it, while pread of a hole reads zeros and allocates
// nothing, so a sparse terabyte streams in a few MiB.

// chunk is the bytes moved at a time.
const chunk = 4 << 20

// spoolMem is the most of a pipe put keeps in memory; a longer input goes
// to an unlinked temporary file first (the buffer's size must be known
// before it is created).
const spoolMem = 16 << 20

// putInput is what put stores: r holds size bytes.
type putInput struct {
	r    io.Reader
	size int64
	f    *os.File // to close, if any
}

func (in putInput) Close() {
	if in.f != nil {
		in.f.Close()
	}
}

// openPutInput opens FILE, or stdin for "-". A regular file (stdin
// redirected from one too) is read as it is; a pipe is read into memory up
// to spoolMem, and spooled to a temporary file beyond that.
func openPutInput(name string, stdin *os.File) (putInput, error) {
	f := stdin
	if name != "-" {
		var err error
		if f, err = os.Open(name); err != nil {
			return putInput{}, err
		}
	}
	own := f
	if name == "-" {
		own = nil
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		pos, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			pos = 0
		}
		return putInput{r: f, size: fi.Size() - pos, f: own}, nil
	}
	head := make([]byte, 0, 64<<10)
	for len(head) < spoolMem {
		if len(head) == cap(head) {
			head = append(head, 0)[:len(head)]
		}
		n, err := f.Read(head[len(head):cap(head)])
		head = head[:len(head)+n]
		if errors.Is(err, io.EOF) {
			if own != nil {
				own.Close()
			}
			return putInput{r: bytes.NewReader(head), size: int64(len(head))}, nil
		}
		if err != nil {
			if own != nil {
				own.Close()
			}
			return putInput{}, err
		}
	}
	tmp, err := os.CreateTemp("", "gpupool-put-")
	if err == nil {
		os.Remove(tmp.Name())
		_, err = tmp.Write(head)
	}
	var n int64
	if err == nil {
		n, err = io.Copy(tmp, f)
	}
	if own != nil {
		own.Close()
	}
	if err == nil {
		_, err = tmp.Seek(0, io.SeekStart)
	}
	if err != nil {
		if tmp != nil {
			tmp.Close()
		}
		return putInput{}, fmt.Errorf("spooling the input: %w", err)
	}
	return putInput{r: tmp, size: int64(len(head)) + n, f: tmp}, nil
}

// memfdOf returns the slab fd and offset of b when it lives in a host
// (memfd) slab, else fd -1.
func memfdOf(b *pool.Buffer) (int, int64) {
	sh := b.Share()
	if sh.Kind != device.ShareMemfd || sh.FD < 0 {
		return -1, 0
	}
	return sh.FD, sh.Offset
}

// writeBuffer fills b from r, chunk by chunk.
func writeBuffer(dev device.Device, b *pool.Buffer, r io.Reader) error {
	fd, base := memfdOf(b)
	buf := make([]byte, min(chunk, b.Size()))
	for off := int64(0); off < b.Size(); {
		n := min(int64(len(buf)), b.Size()-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return fmt.Errorf("reading the input at byte %d of %d: %w", off, b.Size(), err)
		}
		var err error
		if fd >= 0 {
			err = pwriteAll(fd, buf[:n], base+off)
		} else {
			err = dev.CopyIn(b.Buffer, off, buf[:n])
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// readBuffer writes b's bytes to w, chunk by chunk.
func readBuffer(dev device.Device, b *pool.Buffer, w io.Writer) error {
	fd, base := memfdOf(b)
	buf := make([]byte, min(chunk, b.Size()))
	for off := int64(0); off < b.Size(); {
		n := min(int64(len(buf)), b.Size()-off)
		var err error
		if fd >= 0 {
			err = preadAll(fd, buf[:n], base+off)
		} else {
			err = dev.CopyOut(buf[:n], b.Buffer, off)
		}
		if err != nil {
			return err
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func pwriteAll(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if err != nil {
			return fmt.Errorf("write to the slab: %w", err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

func preadAll(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pread(fd, p, off)
		if err != nil {
			return fmt.Errorf("read from the slab: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("read from the slab: %w at byte %d", io.ErrUnexpectedEOF, off)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}
