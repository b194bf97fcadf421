package device_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
)

// TestAutoPicksWhatIsThere runs everywhere: with a usable GPU, Auto returns
// the CUDA device; without one (CI), Auto returns the host device and
// NewCUDA fails with an error that says why and wraps the cause.
func TestAutoPicksWhatIsThere(t *testing.T) {
	d, err := device.Auto(0)
	if err != nil {
		t.Fatalf("Auto(0): %v", err)
	}
	defer d.Close()
	if cuda.Available() {
		c, ok := d.(*device.CUDA)
		if !ok {
			t.Fatalf("a GPU is available but Auto gave %v", d)
		}
		if c.Kind() != device.KindCUDA || c.Ordinal() != 0 || !strings.HasPrefix(c.String(), "cuda:0 ") {
			t.Fatalf("Auto gave %v (kind %v, ordinal %d)", c, c.Kind(), c.Ordinal())
		}
		return
	}
	if d.Kind() != device.KindHost {
		t.Fatalf("no GPU, but Auto gave %v", d)
	}
	_, err = device.NewCUDA(0)
	if err == nil {
		t.Fatal("NewCUDA(0) succeeded without a usable GPU")
	}
	if !device.NoGPU(err) {
		t.Fatalf("NewCUDA(0) without a GPU: %v does not say there is no GPU", err)
	}
	if errors.Is(err, cuda.ErrNoLibrary) && !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("error does not name the missing library: %v", err)
	}
	if strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("error is not one line: %q", err)
	}
}

// TestNewCUDABadOrdinal: a negative or absent ordinal is an error meaning
// "no such GPU", on every machine.
func TestNewCUDABadOrdinal(t *testing.T) {
	for _, o := range []int{-1, 1 << 20} {
		d, err := device.NewCUDA(o)
		if err == nil {
			d.Close()
			t.Fatalf("NewCUDA(%d) succeeded", o)
		}
		if !device.NoGPU(err) {
			t.Fatalf("NewCUDA(%d): %v", o, err)
		}
	}
}

func newCUDA(t *testing.T) *device.CUDA {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestCUDADescribe(t *testing.T) {
	d := newCUDA(t)
	ma, mi := d.ComputeCapability()
	if ma < 3 || d.Name() == "" || d.TotalMem() <= 0 {
		t.Fatalf("capability %d.%d, name %q, memory %d", ma, mi, d.Name(), d.TotalMem())
	}
	want := "cuda:0 " + d.Name() + " (sm_" + strconv.Itoa(ma) + strconv.Itoa(mi) + ")"
	if d.String() != want {
		t.Fatalf("String() = %q, want %q", d.String(), want)
	}
	if d.Stream() == 0 {
		t.Fatal("no device stream")
	}
}

func TestCUDAAllocCopyRoundTrip(t *testing.T) {
	d := newCUDA(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, n := range []int{1, 255, 4096, 1<<20 + 7} {
		b, err := d.Alloc(int64(n))
		if err != nil {
			t.Fatal(err)
		}
		if b.Ptr()%256 != 0 || b.Size() != int64(n) || b.Bytes() != nil || b.Device() != device.Device(d) {
			t.Fatalf("buffer ptr %#x size %d host %v", b.Ptr(), b.Size(), b.Bytes() != nil)
		}
		if sh := b.Share(); sh.Kind != device.ShareLegacyIPC || sh.Legacy == ([64]byte{}) || sh.Size != int64(n) {
			t.Fatalf("share %v size %d (want a legacy IPC handle)", sh.Kind, sh.Size)
		}
		src := randBytes(r, n)
		if err := d.CopyIn(b, 0, src); err != nil {
			t.Fatal(err)
		}
		// Overwrite a middle range at an offset, then read all back.
		off := n / 3
		patch := randBytes(r, n-off-n/5)
		if err := d.CopyIn(b, int64(off), patch); err != nil {
			t.Fatal(err)
		}
		copy(src[off:], patch)
		got := make([]byte, n)
		if err := d.CopyOut(got, b, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: round trip differs", n)
		}
		// A view reads the same bytes at its offset.
		v, err := b.View(int64(off), int64(n-off))
		if err != nil {
			t.Fatal(err)
		}
		part := make([]byte, n-off)
		if err := d.CopyOut(part, v, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(part, src[off:]) {
			t.Fatalf("%d bytes: view at %d differs", n, off)
		}
		if err := d.CopyOut(make([]byte, 2), b, int64(n-1)); !errors.Is(err, device.ErrRange) {
			t.Fatalf("read past the end: %v", err)
		}
		if err := d.CopyIn(b, -1, []byte{1}); !errors.Is(err, device.ErrRange) {
			t.Fatalf("negative offset: %v", err)
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		if err := b.Free(); !errors.Is(err, device.ErrFreed) {
			t.Fatalf("second Free: %v", err)
		}
		if err := d.CopyOut(got[:1], b, 0); !errors.Is(err, device.ErrFreed) {
			t.Fatalf("read after Free: %v", err)
		}
	}
	if _, err := d.Alloc(0); !errors.Is(err, device.ErrBadSize) {
		t.Fatalf("Alloc(0): %v", err)
	}
	hb, err := device.NewHost().Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Free()
	if err := d.CopyIn(hb, 0, make([]byte, 4)); !errors.Is(err, device.ErrWrongKind) {
		t.Fatalf("CopyIn to a host buffer: %v", err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestCUDACloseTwiceAndAfter(t *testing.T) {
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := d.Alloc(16); !errors.Is(err, device.ErrClosed) {
		t.Fatalf("Alloc after Close: %v", err)
	}
}

// Child process protocol: the parent re-runs this test binary with
// -test.run=^TestCUDAChildHelper$ and these variables set; the shared fd (VMM)
// is fd 3. The child checks that the buffer holds the bytes of the file
// childData, then overwrites the first childPatch bytes with their
// complement, which the parent checks afterwards (so the mapping is shared
// both ways, not copied).
const (
	envChildMode = "GPUKIT_DEVICE_TEST_CHILD" // "vmm" or "ipc"
	envChildData = "GPUKIT_DEVICE_TEST_DATA"  // file with the expected bytes
	envChildSlab = "GPUKIT_DEVICE_TEST_SLAB"  // slab size
	envChildIPC  = "GPUKIT_DEVICE_TEST_IPC"   // hex legacy IPC handle
	childPatch   = 4096
)

func runChild(t *testing.T, mode string, data []byte, sh device.Shareable, extra *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAChildHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envChildMode+"="+mode, envChildData+"="+path,
		envChildSlab+"="+strconv.FormatInt(sh.SlabSize, 10),
		envChildIPC+"="+hex.EncodeToString(sh.Legacy[:]))
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra}
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("child ok")) {
		t.Fatalf("child (%s): %v\n%s", mode, err, out)
	}
}

func checkPatched(t *testing.T, d *device.CUDA, b *device.Buffer, data []byte) {
	t.Helper()
	got := make([]byte, len(data))
	if err := d.CopyOut(got, b, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		want := data[i]
		if i < childPatch {
			want = ^want
		}
		if got[i] != want {
			t.Fatalf("byte %d after the child wrote: %#x, want %#x", i, got[i], want)
		}
	}
}

func TestCUDAVMMSharedWithChild(t *testing.T) {
	d := newCUDA(t)
	gran, err := d.VMMGranularity()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 4))
	size := gran + 1 + int64(r.IntN(1<<16)) // two granules
	b, err := d.AllocVMM(size)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	}()
	sh := b.Share()
	if sh.Kind != device.ShareVMM || sh.FD < 0 || sh.SlabSize != 2*gran || sh.Offset != 0 || sh.Size != size || b.Size() != size {
		t.Fatalf("share %+v (granularity %d, size %d)", sh, gran, size)
	}
	data := randBytes(r, int(size))
	if err := d.CopyIn(b, 0, data); err != nil {
		t.Fatal(err)
	}
	dup, err := unix.Dup(sh.FD)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "vmm-slab")
	defer f.Close()
	runChild(t, "vmm", data, sh, f)
	checkPatched(t, d, b, data)

	if _, err := d.ImportVMM(device.Shareable{Kind: device.ShareMemfd, FD: 3}); !errors.Is(err, device.ErrWrongKind) {
		t.Fatalf("ImportVMM of a memfd: %v", err)
	}
	if _, err := d.ImportVMM(device.Shareable{Kind: device.ShareVMM, FD: sh.FD, SlabSize: gran, Offset: gran - 1, Size: 2}); !errors.Is(err, device.ErrRange) {
		t.Fatalf("ImportVMM past the slab: %v", err)
	}
}

func TestCUDALegacyIPCSharedWithChild(t *testing.T) {
	d := newCUDA(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 5))
	size := childPatch + 1 + r.IntN(1<<16)
	b, err := d.Alloc(int64(size))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	data := randBytes(r, size)
	if err := d.CopyIn(b, 0, data); err != nil {
		t.Fatal(err)
	}
	runChild(t, "ipc", data, b.Share(), nil)
	checkPatched(t, d, b, data)
}

// TestCUDAChildHelper is the child half of the sharing tests; it does
// nothing unless started by one of them.
func TestCUDAChildHelper(t *testing.T) {
	mode := os.Getenv(envChildMode)
	if mode == "" {
		t.Skip("helper process of TestCUDAVMMSharedWithChild / TestCUDALegacyIPCSharedWithChild")
	}
	want, err := os.ReadFile(os.Getenv(envChildData))
	if err != nil {
		t.Fatal(err)
	}
	slab, err := strconv.ParseInt(os.Getenv(envChildSlab), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var b *device.Buffer
	switch mode {
	case "vmm":
		b, err = d.ImportVMM(device.Shareable{Kind: device.ShareVMM, FD: 3, SlabSize: slab, Size: int64(len(want))})
	case "ipc":
		h, herr := hex.DecodeString(os.Getenv(envChildIPC))
		if herr != nil || len(h) != 64 {
			t.Fatalf("bad IPC handle %q", os.Getenv(envChildIPC))
		}
		sh := device.Shareable{Kind: device.ShareLegacyIPC, FD: -1, SlabSize: slab, Size: int64(len(want))}
		copy(sh.Legacy[:], h)
		b, err = d.OpenIPC(sh)
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := d.CopyOut(got, b, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("child read different bytes")
	}
	patch := make([]byte, childPatch)
	for i := range patch {
		patch[i] = ^want[i]
	}
	if err := d.CopyIn(b, 0, patch); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	t.Log("child ok")
}
