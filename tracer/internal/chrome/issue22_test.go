package chrome

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc/ipctest"
)

// envWriter makes the test binary a writer child (TestWriterKilled,
// TestWriterSizeLimited): it writes random events to $TRACE_OUT, flushing
// every few, and prints "writing" once the first flush is done.
const envWriter = "CHROME_TEST_WRITER"

// writerChild is the child's work: it returns when writing failed, after
// printing the error and the counts on stdout.
func writerChild(t *testing.T) {
	signal.Ignore(syscall.SIGXFSZ) // a size limit fails the write instead of killing
	if n, _ := strconv.ParseUint(os.Getenv("FSIZE"), 10, 64); n > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := Create(os.Getenv("TRACE_OUT"), 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for i := 0; ; i++ {
		w.Add(randEvent(r, i))
		if i%(1+r.IntN(3000)) == 0 {
			if err := w.Flush(); err != nil {
				fmt.Printf("error %v\nwritten %d lost %d guarded %v\n", err, w.Written(), w.Lost(), w.Guarded())
				w.Close()
				return
			}
			if i < 3000 {
				fmt.Println("writing")
			}
		}
	}
}

func writerCmd(t *testing.T, test, out string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), append([]string{envWriter + "=1", "TRACE_OUT=" + out}, env...)...)
	return cmd
}

// parseFile reads a trace file and fails the test unless it is valid.
func parseFile(t *testing.T, path string) *Trace {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Parse(b)
	if err != nil {
		t.Fatalf("%s is not valid: %v (%d bytes, ending %q)", path, err, len(b), b[max(0, len(b)-80):])
	}
	return tr
}

// Issue 22, item 6: a writer killed with SIGKILL at any moment of a busy
// run (flushes of up to megabytes) leaves a valid file: the closer cuts
// it back to the last flush written whole and closes it. 16 kills at
// random moments.
func TestWriterKilled(t *testing.T) {
	if os.Getenv(envWriter) != "" {
		writerChild(t)
		return
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for k := 0; k < 16; k++ {
		out := filepath.Join(dir, fmt.Sprintf("t%d.json", k))
		cmd := writerCmd(t, "TestWriterKilled", out)
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "writing\n" {
			cmd.Process.Kill()
			t.Fatalf("child: %q %v", line, err)
		}
		time.Sleep(time.Duration(r.IntN(120)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		// The closer fixes the file after the kill; give it a moment.
		var tr *Trace
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			b, _ := os.ReadFile(out)
			if tr, _ = Parse(b); tr != nil {
				break
			}
			if time.Now().After(deadline) {
				parseFile(t, out)
			}
		}
		if len(tr.Events) == 0 {
			t.Fatalf("kill %d: no events kept", k)
		}
		t.Logf("kill %d: %d events kept", k, len(tr.Events))
	}
}

// Issue 22, item 6: a full disk (here a size limit on the writer's files,
// RLIMIT_FSIZE, which fails writes past it as a full disk does) stops the
// writer: the error names the file (not the temporary name it was made
// under), the file is valid and holds exactly the events counted written,
// the rest are counted lost.
func TestWriterSizeLimited(t *testing.T) {
	if os.Getenv(envWriter) != "" {
		writerChild(t)
		return
	}
	out := filepath.Join(t.TempDir(), "t.json")
	cmd := writerCmd(t, "TestWriterSizeLimited", out, "FSIZE=300000")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	checkStopped(t, out, string(b))
}

// checkStopped checks what a writer that stopped on a failed write said
// and left.
func checkStopped(t *testing.T, out, said string) {
	t.Helper()
	var errLine string
	var written, lost uint64
	for _, line := range strings.Split(said, "\n") {
		switch {
		case strings.HasPrefix(line, "error "):
			errLine = line
		case strings.HasPrefix(line, "written "):
			fmt.Sscanf(line, "written %d lost %d", &written, &lost)
		}
	}
	if errLine == "" || !strings.Contains(errLine, out) || strings.Contains(errLine, ".tmp") || !strings.Contains(errLine, "stopped writing") {
		t.Fatalf("the writer said:\n%s", said)
	}
	tr := parseFile(t, out)
	if uint64(len(tr.Events)) != written || written == 0 || lost == 0 {
		t.Fatalf("%d events in the file; the writer counted %d written, %d lost", len(tr.Events), written, lost)
	}
	t.Logf("%s; %d written, %d lost", errLine, written, lost)
}

// Issue 22, item 6: a full disk, for real: a 256 KiB tmpfs (root only:
// mount). Without root, TestWriterSizeLimited stands for it.
func TestWriterDiskFull(t *testing.T) {
	if os.Getenv(envWriter) != "" {
		writerChild(t)
		return
	}
	dir := ipctest.SmallTmpfs(t, "256k")
	out := filepath.Join(dir, "t.json")
	cmd := writerCmd(t, "TestWriterDiskFull", out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	checkStopped(t, out, string(b))
}
