package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
)

// envChild selects a child role when the test binary re-executes itself.
const envChild = "GPUKIT_CUDA_TEST_CHILD"

func TestMain(m *testing.M) {
	switch role := os.Getenv(envChild); role {
	case "":
		os.Exit(m.Run())
	case "hide":
		cuda.HideLibrariesForTest()
		os.Exit(m.Run())
	default:
		if err := childMain(role); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runChild re-executes the test binary in role with extra environment and
// files (fd 3, 4, ...), and returns its stdout.
func runChild(t *testing.T, role string, env []string, files ...*os.File) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envChild+"="+role), env...)
	cmd.ExtraFiles = files
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", role, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestCallsWithoutLibrary runs every binding in a child process where no
// CUDA library can be found: each must return an error naming the library
// (wrapping ErrNoLibrary), none may panic. Runs on every machine.
func TestCallsWithoutLibrary(t *testing.T) {
	if os.Getenv(envChild) != "hide" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCallsWithoutLibrary$", "-test.v")
		cmd.Env = append(os.Environ(), envChild+"=hide", cuda.EnvCUDAPath+"="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestCallsWithoutLibrary")) {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	if cuda.Available() {
		t.Fatal("Available() with hidden libraries")
	}
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, cuda.ErrNoLibrary) {
			t.Errorf("%s: %v, want ErrNoLibrary", name, err)
			return
		}
		if msg := err.Error(); !strings.Contains(msg, "GPUKIT_CUDA_PATH") || strings.Contains(msg, "\n") {
			t.Errorf("%s: message %q", name, msg)
		}
	}
	buf := make([]byte, 64)
	host := unsafe.Pointer(&buf[0])
	d := cuda.Device(0)
	var err error
	check("Init", cuda.Init())
	_, err = cuda.DriverVersion()
	check("DriverVersion", err)
	_, err = cuda.DeviceCount()
	check("DeviceCount", err)
	_, err = cuda.GetDevice(0)
	check("GetDevice", err)
	_, err = d.Name()
	check("Name", err)
	_, _, err = d.ComputeCapability()
	check("ComputeCapability", err)
	_, err = d.TotalMem()
	check("TotalMem", err)
	_, err = d.Attribute(cuda.AttrMultiprocessorCount)
	check("Attribute", err)
	_, err = cuda.PrimaryContext(d)
	check("PrimaryContext", err)
	check("CtxSynchronize", cuda.CtxSynchronize())
	_, err = cuda.MemAlloc(64)
	check("MemAlloc", err)
	check("MemFree", cuda.MemFree(1))
	check("MemcpyHtoD", cuda.MemcpyHtoD(1, host, 64))
	check("MemcpyDtoH", cuda.MemcpyDtoH(host, 1, 64))
	check("MemcpyDtoD", cuda.MemcpyDtoD(1, 2, 64))
	check("MemcpyHtoDAsync", cuda.MemcpyHtoDAsync(1, host, 64, 0))
	check("MemcpyDtoHAsync", cuda.MemcpyDtoHAsync(host, 1, 64, 0))
	check("MemcpyDtoDAsync", cuda.MemcpyDtoDAsync(1, 2, 64, 0))
	check("MemsetD8", cuda.MemsetD8(1, 0, 64))
	check("MemsetD32", cuda.MemsetD32(1, 0, 16))
	check("MemsetD32Async", cuda.MemsetD32Async(1, 0, 16, 0))
	_, err = cuda.MemHostAlloc(64)
	check("MemHostAlloc", err)
	check("MemFreeHost", cuda.MemFreeHost(host))
	_, _, err = cuda.MemGetInfo()
	check("MemGetInfo", err)
	_, err = cuda.MemGetAllocationGranularity(d, true)
	check("MemGetAllocationGranularity", err)
	_, err = cuda.MemCreate(1<<21, d)
	check("MemCreate", err)
	_, err = cuda.MemExportToFD(1)
	check("MemExportToFD", err)
	_, err = cuda.MemImportFromFD(0)
	check("MemImportFromFD", err)
	_, err = cuda.MemAddressReserve(1<<21, 0)
	check("MemAddressReserve", err)
	check("MemAddressFree", cuda.MemAddressFree(1, 1<<21))
	check("MemMap", cuda.MemMap(1, 1<<21, 1))
	check("MemSetAccess", cuda.MemSetAccess(1, 1<<21, d))
	check("MemUnmap", cuda.MemUnmap(1, 1<<21))
	check("MemRelease", cuda.MemRelease(1))
	_, err = cuda.IpcGetMemHandle(1)
	check("IpcGetMemHandle", err)
	_, err = cuda.IpcOpenMemHandle(cuda.IpcMemHandle{})
	check("IpcOpenMemHandle", err)
	check("IpcCloseMemHandle", cuda.IpcCloseMemHandle(1))
	_, err = cuda.IpcGetEventHandle(1)
	check("IpcGetEventHandle", err)
	_, err = cuda.IpcOpenEventHandle(cuda.IpcEventHandle{})
	check("IpcOpenEventHandle", err)
	_, err = cuda.StreamCreate(true)
	check("StreamCreate", err)
	s := cuda.Stream(1)
	check("Stream.Synchronize", s.Synchronize())
	check("Stream.Destroy", s.Destroy())
	check("Stream.WaitEvent", s.WaitEvent(1))
	_, err = s.Query()
	check("Stream.Query", err)
	check("Stream.BeginCapture", s.BeginCapture(cuda.CaptureModeGlobal))
	_, err = s.EndCapture()
	check("Stream.EndCapture", err)
	_, err = s.IsCapturing()
	check("Stream.IsCapturing", err)
	_, err = cuda.EventCreate(cuda.EventDefault)
	check("EventCreate", err)
	e := cuda.Event(1)
	check("Event.Record", e.Record(0))
	check("Event.Synchronize", e.Synchronize())
	_, err = e.Query()
	check("Event.Query", err)
	check("Event.Destroy", e.Destroy())
	_, err = cuda.EventElapsed(1, 2)
	check("EventElapsed", err)
	_, err = cuda.Graph(1).Instantiate()
	check("Graph.Instantiate", err)
	check("Graph.Destroy", cuda.Graph(1).Destroy())
	check("GraphExec.Launch", cuda.GraphExec(1).Launch(0))
	check("GraphExec.Update", cuda.GraphExec(1).Update(1))
	check("GraphExec.Destroy", cuda.GraphExec(1).Destroy())
	_, err = cuda.ModuleLoadData([]byte(".version 8.0\n"))
	check("ModuleLoadData", err)
	_, err = cuda.Module(1).Function("k")
	check("Module.Function", err)
	check("Module.Unload", cuda.Module(1).Unload())
	_, err = cuda.Function(1).Attribute(cuda.FuncNumRegs)
	check("Function.Attribute", err)
	check("Function.SetAttribute", cuda.Function(1).SetAttribute(cuda.FuncMaxDynamicSharedSizeBytes, 1))
	n := int32(3)
	check("LaunchKernel", cuda.LaunchKernel(1, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, 0, unsafe.Pointer(&n)))
	_, _, err = cuda.NVRTCVersion()
	check("NVRTCVersion", err)
	_, err = cuda.SupportedArchs()
	check("SupportedArchs", err)
	_, err = cuda.CreateProgram("__global__ void k(){}", "k.cu", map[string]string{"a.h": ""})
	check("CreateProgram", err)
	_, err = cuda.PCHHeapSize()
	check("PCHHeapSize", err)
	check("SetPCHHeapSize", cuda.SetPCHHeapSize(1<<20))
	_, err = cuda.LtCreate()
	check("LtCreate", err)
	_, err = cuda.LtVersion()
	check("LtVersion", err)

	// Methods on zero values return errors too.
	var p cuda.Program
	if err := p.Compile(nil); !errors.Is(err, cuda.ErrProgramDestroyed) {
		t.Errorf("Program.Compile on zero value: %v", err)
	}
	var h cuda.LtHandle
	spec := cuda.GemmSpec{M: 2, N: 2, K: 2}
	if err := h.Matmul(spec, cuda.GemmArgs{A: 1, B: 1, D: 1}, 0); !errors.Is(err, cuda.ErrHandleDestroyed) {
		t.Errorf("Matmul on zero handle: %v", err)
	}
	if err := h.Matmul(spec, cuda.GemmArgs{}, 0); !errors.Is(err, cuda.ErrBadGemm) {
		t.Errorf("Matmul with nil operands: %v", err)
	}
	if _, err := cuda.MemAlloc(-1); !errors.Is(err, cuda.ErrBadArg) {
		t.Errorf("MemAlloc(-1): %v", err)
	}
	if err := cuda.LaunchKernel(1, [3]uint32{}, [3]uint32{}, 0, 0, nil); !errors.Is(err, cuda.ErrBadArg) {
		t.Errorf("LaunchKernel nil arg: %v", err)
	}
	if _, err := cuda.EventCreate(cuda.EventInterprocess); !errors.Is(err, cuda.ErrBadArg) {
		t.Errorf("EventCreate(Interprocess) without DisableTiming: %v", err)
	}
	runtime.KeepAlive(buf)
}
