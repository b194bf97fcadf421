// Package collect owns tracer's collector: it accepts connections of traced
// processes on a SOCK_SEQPACKET Unix socket, decodes their batches
// (libgpu/trace wire format), refuses and counts malformed ones while it keeps
// serving, and turns records into Chrome trace events written as they come
// (chrome.Writer): X, i, C, M and, once both ends of a flow id have arrived,
// the s/f pair.
//
// Thread ids: track 0 of a process is its main thread (tid = pid); track k
// (1..1023) gets tid = pid + k<<22, unique across processes since Linux pids
// are below 2^22, and within uint32 as Perfetto's JSON importer wants.
package collect
