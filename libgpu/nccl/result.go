package nccl

import "strconv"

// Result is NCCL's ncclResult_t. It implements error with names compiled
// into the binary (nccl.h), so it reads well without the library:
// "ncclSystemError (2)"; unknown codes read "ncclResult_t(42)".
type Result int32

// Results (nccl.h; ncclRemoteError since NCCL 2.13, ncclInProgress since
// 2.14, ncclTimeout since 2.28).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1 // a CUDA call inside NCCL failed
	SystemError        Result = 2 // a system call failed (sockets, shared memory)
	InternalError      Result = 3 // a bug in NCCL, or memory corruption
	InvalidArgument    Result = 4 // a bad argument (pointer, count, type, rank)
	InvalidUsage       Result = 5 // a call made in the wrong order or state
	RemoteError        Result = 6 // a peer failed or went away
	InProgress         Result = 7 // a non-blocking operation is still running
	Timeout            Result = 8 // an operation timed out
)

var resultNames = map[Result]string{
	0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
	4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
	8: "ncclTimeout",
}

// Name is the enumerator's name, or "" for an unknown code.
func (r Result) Name() string { return resultNames[r] }

func (r Result) Error() string {
	if n := resultNames[r]; n != "" {
		return n + " (" + strconv.Itoa(int(r)) + ")"
	}
	return "ncclResult_t(" + strconv.Itoa(int(r)) + ")"
}

// CallError is a failed NCCL call: the function, its result (which
// errors.Is and errors.As see) and NCCL's own description of the last
// error (ncclGetLastError, since NCCL 2.13; may be empty).
type CallError struct {
	Func   string
	Err    Result
	Detail string
}

func (e *CallError) Error() string {
	s := "nccl: " + e.Func + ": " + e.Err.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the result code.
func (e *CallError) Unwrap() error { return e.Err }
