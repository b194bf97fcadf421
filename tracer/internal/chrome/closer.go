package chrome

import (
	"encoding/binary"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The closer: a child process (this binary again, selected by closerEnv
// before anything else runs) that keeps a trace file closable when its
// writer is killed. It holds the file (fd 3) and the read end of a pipe
// (fd 4) on which the writer sends each committed end (the offset of the
// closing tail, 8 bytes little-endian, atomic on a pipe) and, at a clean
// Close, doneMark. When the pipe ends without doneMark (the writer died:
// the kernel closes its end), it cuts the file back to the last committed
// end and writes the closing there.

const (
	closerEnv = "GPUKIT_TRACE_CLOSER"
	doneMark  = math.MaxUint64
)

func init() {
	if os.Getenv(closerEnv) == "1" {
		os.Exit(runCloser(os.NewFile(3, "trace"), os.NewFile(4, "ends")))
	}
}

// closer is the writer's end of the pipe; a nil *closer does nothing.
type closer struct {
	w   *os.File
	cmd *exec.Cmd
}

// startCloser starts the closer of f, whose committed end is end now. It
// returns nil when the closer cannot start (the Writer then works as
// before: valid after every Flush, not after a kill during one).
func startCloser(f *os.File, end int64) *closer {
	exe, err := os.Executable()
	if err != nil {
		exe = "/proc/self/exe"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil
	}
	defer r.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), closerEnv+"=1")
	cmd.ExtraFiles = []*os.File{f, r}
	cmd.Dir = "/"
	// A group of its own: the signals a terminal or a kill of the
	// writer's group sends do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil
	}
	// Reap it whenever it ends, so it never lingers as a zombie.
	go cmd.Wait()
	// A writer never waits for its closer: when the pipe is full (the
	// closer is behind), an end is skipped; the next one supersedes it.
	unix.SetNonblock(int(w.Fd()), true)
	c := &closer{w: w, cmd: cmd}
	c.commit(end)
	return c
}

func (c *closer) send(v uint64) {
	if c == nil {
		return
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	unix.Write(int(c.w.Fd()), b[:])
}

// commit tells the closer that the file is whole and closed up to end.
func (c *closer) commit(end int64) { c.send(uint64(end)) }

// done ends the closer: the file was closed cleanly.
func (c *closer) done() {
	if c == nil {
		return
	}
	c.send(doneMark)
	c.w.Close()
}

// stop ends the closer without a word about the file (a failed Create:
// the closer closes a temporary file that is then removed).
func (c *closer) stop() {
	if c == nil {
		return
	}
	c.done()
}

// runCloser is the closer process: it returns its exit status.
func runCloser(f, ends *os.File) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	last := int64(-1)
	var b [8]byte
	for {
		if _, err := io.ReadFull(ends, b[:]); err != nil {
			break
		}
		v := binary.LittleEndian.Uint64(b[:])
		if v == doneMark {
			return 0
		}
		last = int64(v)
	}
	if last < int64(len(head)) {
		return 1
	}
	if err := closeAt(f, last); err != nil {
		return 1
	}
	return 0
}
