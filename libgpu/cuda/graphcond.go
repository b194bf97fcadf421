package cuda

// Conditional graph nodes (CUDA 12.4+ drivers; CUDA Programming Guide,
// "CUDA Graphs: Conditional Graph Nodes"): an IF, WHILE or SWITCH node whose
// body graphs run as a conditional handle says, set on the device by a
// kernel (cudaGraphSetConditional), so a graph can loop or branch with no
// host round trip. The pieces to build one inside a stream capture, as
// NVIDIA's NeMo does for its greedy decoding loops
// (nemo/core/utils/cuda_python_utils.py with_conditional_node): read the
// capture's graph and dependencies (Stream.CaptureInfo), create a handle on
// that graph (Graph.ConditionalHandleCreate), add the node after the
// dependencies (Graph.AddConditionalNode), make the node the capture's
// dependency (Stream.SetCaptureDependencies), and capture the body into
// the node's body graph from a second stream (Stream.BeginCaptureToGraph;
// a stream that is capturing cannot begin another capture).
//
// The symbols are the versions with edge data that CUDA 12.3 added and
// CUDA 13 kept under their plain names in cuda.h (cuGraphAddNode_v2,
// cuStreamGetCaptureInfo_v3, cuStreamUpdateCaptureDependencies_v2);
// drivers export both. An older driver answers ErrNoSymbol.

import (
	"unsafe"
)

var (
	pStreamGetCaptureInfo         = newProc(libDriver, "cuStreamGetCaptureInfo_v3")
	pStreamUpdateCaptureDeps      = newProc(libDriver, "cuStreamUpdateCaptureDependencies_v2")
	pStreamBeginCaptureToGraph    = newProc(libDriver, "cuStreamBeginCaptureToGraph")
	pGraphConditionalHandleCreate = newProc(libDriver, "cuGraphConditionalHandleCreate")
	pGraphAddNode                 = newProc(libDriver, "cuGraphAddNode_v2")
	pGraphCreate                  = newProc(libDriver, "cuGraphCreate")
)

// GraphNode is a CUgraphNode.
type GraphNode uintptr

// GraphEdgeData is a CUgraphEdgeData (from_port, to_port, type, 5 reserved
// bytes): zero for the ordinary full dependency of stream capture.
type GraphEdgeData [8]byte

// GraphConditionalHandle is a CUgraphConditionalHandle: the 64-bit value a
// kernel passes to cudaGraphSetConditional.
type GraphConditionalHandle uint64

// GraphConditionalType is a CUgraphConditionalNodeType.
type GraphConditionalType int32

// Conditional node types.
const (
	GraphCondIf     GraphConditionalType = 0
	GraphCondWhile  GraphConditionalType = 1
	GraphCondSwitch GraphConditionalType = 2
)

// graphNodeTypeConditional is CU_GRAPH_NODE_TYPE_CONDITIONAL.
const graphNodeTypeConditional = 13

// conditionalNodeParams mirrors CUDA_CONDITIONAL_NODE_PARAMS (32 bytes):
// handle, type, size, phGraph_out (a CUDA-owned array of size body graphs,
// filled in when the node is added), ctx.
type conditionalNodeParams struct {
	handle GraphConditionalHandle
	typ    GraphConditionalType
	size   uint32
	graphs *Graph
	ctx    uintptr
}

// graphNodeParams mirrors CUgraphNodeParams (256 bytes): type, 3 reserved
// ints, a 232-byte union (here its conditional member) and a reserved
// long long.
type graphNodeParams struct {
	typ       int32
	_         [3]int32
	cond      conditionalNodeParams
	_         [29*8 - 32]byte
	reserved2 int64
}

// CaptureInfo is what cuStreamGetCaptureInfo reports of a stream: whether
// it is capturing (Active), the capture's unique ID, the graph being
// captured and the nodes (with their edge data) the next captured work
// will depend on. Deps and Edges are copies.
type CaptureInfo struct {
	Active bool
	ID     uint64
	Graph  Graph
	Deps   []GraphNode
	Edges  []GraphEdgeData
}

// CaptureInfo queries s's capture state (cuStreamGetCaptureInfo_v3). An
// invalidated capture is an error wrapping ErrorStreamCaptureInvalidated.
func (s Stream) CaptureInfo() (CaptureInfo, error) {
	var st int32
	var info CaptureInfo
	var deps *GraphNode
	var edges *GraphEdgeData
	var n uintptr
	var g uintptr
	if err := pStreamGetCaptureInfo.cu(uintptr(s), uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&info.ID)),
		uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&deps)), uintptr(unsafe.Pointer(&edges)),
		uintptr(unsafe.Pointer(&n))); err != nil {
		return info, err
	}
	switch st {
	case 0:
		return info, nil
	case 2:
		return info, &CallError{Func: "cuStreamGetCaptureInfo", Err: ErrorStreamCaptureInvalidated}
	}
	info.Active, info.Graph = true, Graph(g)
	if n > 0 && deps != nil {
		info.Deps = append([]GraphNode(nil), unsafe.Slice(deps, n)...)
	}
	info.Edges = make([]GraphEdgeData, n)
	if n > 0 && edges != nil {
		copy(info.Edges, unsafe.Slice(edges, n))
	}
	return info, nil
}

// SetCaptureDependencies makes nodes (nodes of s's capture graph, such as
// one added with Graph.AddConditionalNode) the dependencies of the next
// work captured on s, replacing the current ones
// (cuStreamUpdateCaptureDependencies_v2 with
// CU_STREAM_SET_CAPTURE_DEPENDENCIES).
func (s Stream) SetCaptureDependencies(nodes []GraphNode) error {
	if len(nodes) == 0 {
		return badArg("SetCaptureDependencies with no nodes")
	}
	return pStreamUpdateCaptureDeps.cu(uintptr(s), uintptr(unsafe.Pointer(&nodes[0])), 0, uintptr(len(nodes)), 1)
}

// BeginCaptureToGraph starts capturing the work queued on s into the
// existing graph g (a conditional node's body graph, say) instead of a new
// one, with no initial dependencies (cuStreamBeginCaptureToGraph). EndCapture
// ends it and returns g, which stays owned by whoever owned it.
func (s Stream) BeginCaptureToGraph(g Graph, mode StreamCaptureMode) error {
	return pStreamBeginCaptureToGraph.cu(uintptr(s), uintptr(g), 0, 0, 0, uintptr(mode))
}

// GraphCreate creates an empty graph (cuGraphCreate).
func GraphCreate() (Graph, error) {
	var g uintptr
	if err := pGraphCreate.cu(uintptr(unsafe.Pointer(&g)), 0); err != nil {
		return 0, err
	}
	return Graph(g), nil
}

// ConditionalHandleCreate creates a conditional handle for a conditional
// node of g (or of a graph nested in g) in context ctx
// (cuGraphConditionalHandleCreate). With assignDefault the handle is set
// to def at the start of every launch of the graph
// (CU_GRAPH_COND_ASSIGN_DEFAULT); otherwise its value at a launch is
// undefined until a kernel sets it.
func (g Graph) ConditionalHandleCreate(ctx *Context, def uint32, assignDefault bool) (GraphConditionalHandle, error) {
	if ctx == nil {
		return 0, badArg("ConditionalHandleCreate without a context")
	}
	var flags uintptr
	if assignDefault {
		flags = 1
	}
	var h GraphConditionalHandle
	if err := pGraphConditionalHandleCreate.cu(uintptr(unsafe.Pointer(&h)), uintptr(g), ctx.Handle(), uintptr(def), flags); err != nil {
		return 0, err
	}
	return h, nil
}

// AddConditionalNode adds a conditional node of type typ with size body
// graphs (WHILE: 1; IF: 1 or 2; SWITCH: any) to g after deps (with their
// edge data, as CaptureInfo reports them; nil: zero) (cuGraphAddNode_v2
// with CU_GRAPH_NODE_TYPE_CONDITIONAL), and returns the node and its body
// graphs, which belong to the node (fill them with stream capture,
// BeginCaptureToGraph; do not destroy them). Body graphs may hold only
// kernels, memsets, memcopies of device memory, empty nodes, child graphs
// and conditional nodes, all of ctx.
func (g Graph) AddConditionalNode(deps []GraphNode, edges []GraphEdgeData, h GraphConditionalHandle, typ GraphConditionalType, size int, ctx *Context) (GraphNode, []Graph, error) {
	if ctx == nil || size < 1 {
		return 0, nil, badArg("AddConditionalNode needs a context and at least one body")
	}
	if edges != nil && len(edges) != len(deps) {
		return 0, nil, badArg("AddConditionalNode with %d edges for %d dependencies", len(edges), len(deps))
	}
	p := graphNodeParams{typ: graphNodeTypeConditional,
		cond: conditionalNodeParams{handle: h, typ: typ, size: uint32(size), ctx: ctx.Handle()}}
	var dp, ep unsafe.Pointer // converted to uintptr only in the call's argument list (package doc)
	if len(deps) > 0 {
		dp = unsafe.Pointer(&deps[0])
		if len(edges) > 0 {
			ep = unsafe.Pointer(&edges[0])
		}
	}
	var node GraphNode
	if err := pGraphAddNode.cu(uintptr(unsafe.Pointer(&node)), uintptr(g), uintptr(dp), uintptr(ep), uintptr(len(deps)), uintptr(unsafe.Pointer(&p))); err != nil {
		return 0, nil, err
	}
	if p.cond.graphs == nil {
		return 0, nil, badArg("AddConditionalNode: the driver returned no body graphs")
	}
	return node, append([]Graph(nil), unsafe.Slice(p.cond.graphs, size)...), nil
}
