package nccl

import (
	"encoding/hex"
	"fmt"
	"runtime"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/tensor"
)

// UniqueID is ncclUniqueId: 128 opaque bytes (NCCL_UNIQUE_ID_BYTES) that
// rank 0 makes with NewUniqueID and every rank passes to NewComm. It holds
// the address of the bootstrap root rank 0 listens on.
type UniqueID [128]byte

// NewUniqueID makes a unique id (ncclGetUniqueId): NCCL starts its
// bootstrap root in this process, listening on an interface NCCL picks
// (NCCL_SOCKET_IFNAME chooses).
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	err := call(pGetUniqueID, "ncclGetUniqueId", uintptr(unsafe.Pointer(&id[0])))
	return id, err
}

// String is the id in hexadecimal, for logs.
func (id UniqueID) String() string { return hex.EncodeToString(id[:]) }

// Op is a reduction (ncclRedOp_t).
type Op int32

// Reductions. Avg divides the sum by the number of ranks (NCCL ≥ 2.10).
const (
	Sum  Op = 0
	Prod Op = 1
	Max  Op = 2
	Min  Op = 3
	Avg  Op = 4
)

var opNames = map[Op]string{Sum: "sum", Prod: "prod", Max: "max", Min: "min", Avg: "avg"}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", int32(o))
}

// dataType is ncclDataType_t.
type dataType int32

// ncclType maps a tensor dtype to NCCL's: f32 → ncclFloat32 (7), bf16 →
// ncclBfloat16 (9), f16 → ncclFloat16 (6), i32 → ncclInt32 (2), i64 →
// ncclInt64 (4), u8 → ncclUint8 (1).
func ncclType(dt tensor.DType) (dataType, bool) {
	switch dt {
	case tensor.F32:
		return 7, true
	case tensor.BF16:
		return 9, true
	case tensor.F16:
		return 6, true
	case tensor.I32:
		return 2, true
	case tensor.I64:
		return 4, true
	case tensor.U8:
		return 1, true
	}
	return 0, false
}

// The raw calls: device pointers and counts of elements, queued on stream
// s; must run on a thread where the communicator's device context is
// current (inside the device's Do).

// commInit joins a communicator; cfg, when not nil, is its ncclConfig_t.
func commInit(nranks, rank int, id *UniqueID, cfg *config) (uintptr, error) {
	var h uintptr
	err := call(pCommInitRankScalable, "ncclCommInitRankScalable",
		uintptr(unsafe.Pointer(&h)), uintptr(nranks), uintptr(rank), 1, uintptr(unsafe.Pointer(&id[0])), uintptr(unsafe.Pointer(cfg)))
	runtime.KeepAlive(cfg)
	return h, err
}

// config is the head of ncclConfig_t as NCCL 2.23's nccl.h lays it out
// (size_t size; unsigned magic, version; int blocking, cgaClusterSize,
// minCTAs, maxCTAs; const char* netName; int splitShare): 48 bytes on
// amd64. The struct is versioned and only grows at its end: NCCL copies
// min(size, its own size) bytes and resets the fields newer than version
// to their defaults (init.cc, parseCommConfig), so this head works with
// every NCCL from 2.23 on.
type config struct {
	size           uintptr
	magic          uint32
	version        uint32
	blocking       int32
	cgaClusterSize int32
	minCTAs        int32
	maxCTAs        int32
	netName        uintptr
	splitShare     int32
	_              int32
}

// Constants of nccl.h: NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT (INT_MIN).
const (
	configMagic = 0xcafebeef
	configUndef = -1 << 31
)

// newConfig is NCCL_CONFIG_INITIALIZER (of NCCL 2.23) with minCTAs and
// maxCTAs set where positive.
func newConfig(minCTAs, maxCTAs int) *config {
	c := &config{size: unsafe.Sizeof(config{}), magic: configMagic, version: uint32(MinVersion),
		blocking: configUndef, cgaClusterSize: configUndef, minCTAs: configUndef, maxCTAs: configUndef, splitShare: configUndef}
	if minCTAs > 0 {
		c.minCTAs = int32(minCTAs)
	}
	if maxCTAs > 0 {
		c.maxCTAs = int32(maxCTAs)
	}
	return c
}

func allReduce(send, recv cuda.DevicePtr, count int, dt dataType, op Op, comm uintptr, s cuda.Stream) error {
	return call(pAllReduce, "ncclAllReduce", uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), comm, uintptr(s))
}

func broadcast(send, recv cuda.DevicePtr, count int, dt dataType, root int, comm uintptr, s cuda.Stream) error {
	return call(pBroadcast, "ncclBroadcast", uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(root), comm, uintptr(s))
}

func allGather(send, recv cuda.DevicePtr, sendCount int, dt dataType, comm uintptr, s cuda.Stream) error {
	return call(pAllGather, "ncclAllGather", uintptr(send), uintptr(recv), uintptr(sendCount), uintptr(dt), comm, uintptr(s))
}

func reduceScatter(send, recv cuda.DevicePtr, recvCount int, dt dataType, op Op, comm uintptr, s cuda.Stream) error {
	return call(pReduceScatter, "ncclReduceScatter", uintptr(send), uintptr(recv), uintptr(recvCount), uintptr(dt), uintptr(op), comm, uintptr(s))
}

func groupStart() error { return call(pGroupStart, "ncclGroupStart") }
func groupEnd() error   { return call(pGroupEnd, "ncclGroupEnd") }

// asyncError is ncclCommGetAsyncError: the communicator's pending error
// (an error of a peer, a network failure), or nil.
func asyncError(comm uintptr) error {
	var r int32
	if err := call(pCommGetAsyncError, "ncclCommGetAsyncError", comm, uintptr(unsafe.Pointer(&r))); err != nil {
		return err
	}
	if Result(r) == Success || Result(r) == InProgress {
		return nil
	}
	return &CallError{Func: "communicator", Err: Result(r), Detail: describe(Result(r))}
}

// commInt reads one int property of a communicator (count, device, rank).
func commInt(p *cuda.Proc, name string, comm uintptr) (int, error) {
	var v int32
	err := call(p, name, comm, uintptr(unsafe.Pointer(&v)))
	return int(v), err
}
