package kernels

// NVRTC is the runtime compiler a Compiler drives. The CUDA implementation
// (NewNVRTC) wraps libgpu/cuda's nvrtc bindings; tests use fakes.
type NVRTC interface {
	// Version is NVRTC's version, "13.0". It is part of every cache key.
	Version() (string, error)
	// Compile compiles one program. When NVRTC rejects the source it
	// returns the log in Output.Log and an error wrapping ErrCompile; other
	// errors mean NVRTC could not run.
	Compile(job Job) (Output, error)
}

// Job is one NVRTC compilation.
type Job struct {
	Name      string            // program name, used by NVRTC in logs ("selftest.cu")
	Code      []byte            // CUDA C++ source
	Headers   map[string]string // include name -> contents
	Flags     []string          // NVRTC options (Options.Flags)
	NameExprs []string          // name expressions to add before compiling
	PTX       bool              // return PTX instead of a cubin
}

// Output is what a compilation produced.
type Output struct {
	Image   []byte            // cubin, or PTX when Job.PTX
	Log     string            // NVRTC's log (warnings on success)
	Lowered map[string]string // name expression -> lowered (mangled) name
}
