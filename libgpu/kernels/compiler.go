package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	"gpukit/libgpu/trace"
)

// Source is one CUDA C++ translation unit.
type Source struct {
	Name    string            // file name NVRTC reports in logs ("selftest.cu")
	Code    []byte            // the source text
	Headers map[string]string // #include name -> contents (part of the cache key)
}

// Result is a compiled source.
type Result struct {
	Cubin        []byte            // the cubin (nil when PTX was asked for)
	PTX          []byte            // the PTX (nil unless Options.PTX)
	Log          string            // NVRTC's log, rewritten to file:line:col (warnings)
	LoweredNames map[string]string // name expression -> mangled kernel name
	CacheHit     bool              // loaded from the cache, NVRTC not run
	Key          string            // the cache key
	Arch         string            // the real arch compiled for ("sm_90a")
	// Recovered is non-empty when a corrupt cache entry for this key was
	// found, removed and replaced by a fresh compilation; it says why.
	Recovered string
	// CacheErr is why a fresh compilation could not be stored in the cache
	// (a removed or read-only directory, a full disk): the result is good,
	// only a later process compiles again.
	CacheErr error
}

// Image is the cubin, or the PTX for a PTX result.
func (r Result) Image() []byte {
	if r.PTX != nil {
		return r.PTX
	}
	return r.Cubin
}

// CompileError is NVRTC rejecting a source. Log is NVRTC's log rewritten so
// each diagnostic reads "file:line:col: error: ...". It unwraps to ErrCompile.
type CompileError struct {
	Name string
	Log  string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("kernels: compiling %s failed:\n%s", e.Name, e.Log)
}

// Unwrap returns ErrCompile.
func (e *CompileError) Unwrap() error { return ErrCompile }

// Compiler compiles sources through NVRTC and the cache. It is safe for
// concurrent use. Cache may be nil (no caching).
type Compiler struct {
	nvrtc NVRTC
	cache *Cache

	mu      sync.Mutex
	version string
	// OnCorrupt, if set, is called when a corrupt cache entry was removed.
	OnCorrupt func(key string, err error)
}

// NewCompiler returns a Compiler over n, caching in cache (nil: no cache).
func NewCompiler(n NVRTC, cache *Cache) *Compiler {
	return &Compiler{nvrtc: n, cache: cache}
}

// Cache is the compiler's cache (nil when it has none).
func (c *Compiler) Cache() *Cache { return c.cache }

// NVRTCVersion is the version of the NVRTC behind c ("13.0"), asked once.
func (c *Compiler) NVRTCVersion() (string, error) {
	if c.nvrtc == nil {
		return "", ErrNoCompiler
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != "" {
		return c.version, nil
	}
	v, err := c.nvrtc.Version()
	if err != nil {
		return "", err
	}
	c.version = v
	return v, nil
}

// Compile compiles src with opts, or loads the result from the cache. A
// corrupt cache entry is removed and the source recompiled (Result.Recovered
// says so); it is never loaded. A source NVRTC rejects gives a *CompileError.
//
// With tracing on (trace.Default), each call is a span "compile" of category
// "kernels" with the source name, the arch and cache = "hit", "miss" or "off".
func (c *Compiler) Compile(src Source, opts Options) (res Result, err error) {
	sp := trace.Default().Begin("kernels", "compile")
	defer func() {
		sp.Arg(trace.Str("source", src.Name))
		sp.Arg(trace.Str("arch", opts.Arch))
		switch {
		case c.cache == nil:
			sp.Arg(trace.Str("cache", "off"))
		case res.CacheHit:
			sp.Arg(trace.Str("cache", "hit"))
		default:
			sp.Arg(trace.Str("cache", "miss"))
		}
		if err != nil {
			sp.Arg(trace.Str("error", "failed"))
		}
		sp.End()
	}()
	return c.compile(src, opts)
}

// key is the cache key of src compiled with opts, with the NVRTC flags
// and the real arch.
func (c *Compiler) key(src Source, opts Options) (key string, flags []string, arch string, err error) {
	if flags, err = opts.Flags(); err != nil {
		return "", nil, "", err
	}
	ver, err := c.NVRTCVersion()
	if err != nil {
		return "", nil, "", err
	}
	arch = realArch(opts.Arch)
	keyArch := arch
	if opts.PTX {
		keyArch = virtualArch(arch)
	}
	return KeySource(src, opts.keyOptions(flags), ver, keyArch), flags, arch, nil
}

// Cached reports whether the cache holds a good entry for src compiled
// with opts, without compiling (false without a cache; a corrupt entry is
// removed and reported as absent).
func (c *Compiler) Cached(src Source, opts Options) (bool, error) {
	if c.cache == nil {
		return false, nil
	}
	key, _, _, err := c.key(src, opts)
	if err != nil {
		return false, err
	}
	payload, ok, err := c.cache.Get(key)
	switch {
	case errors.Is(err, ErrCorrupt):
		return false, nil
	case err != nil:
		return false, err
	case !ok:
		return false, nil
	}
	_, _, _, derr := decodePayload(payload)
	return derr == nil, nil
}

func (c *Compiler) compile(src Source, opts Options) (Result, error) {
	key, flags, arch, err := c.key(src, opts)
	if err != nil {
		return Result{}, err
	}
	res := Result{Key: key, Arch: arch}
	if c.cache != nil {
		payload, ok, gerr := c.cache.Get(key)
		switch {
		case errors.Is(gerr, ErrCorrupt):
			res.Recovered = gerr.Error()
			if c.OnCorrupt != nil {
				c.OnCorrupt(key, gerr)
			}
		case gerr != nil:
			return Result{}, gerr
		case ok:
			img, lowered, log, derr := decodePayload(payload)
			if derr == nil {
				res.CacheHit = true
				res.LoweredNames = lowered
				res.Log = log
				res.setImage(img, opts.PTX)
				return res, nil
			}
			// A payload whose header and sha256 check out but whose
			// body does not decode was written by a buggy writer:
			// recompile and overwrite it.
			res.Recovered = derr.Error()
		}
	}
	job := Job{Name: src.Name, Code: src.Code, Headers: src.Headers, Flags: flags,
		NameExprs: opts.NameExprs, PTX: opts.PTX}
	out, err := c.nvrtc.Compile(job)
	files := map[string]string{src.Name: string(src.Code)}
	for n, h := range src.Headers {
		files[n] = h
	}
	if err != nil {
		if errors.Is(err, ErrCompile) {
			return Result{}, &CompileError{Name: src.Name, Log: RewriteLog(out.Log, files)}
		}
		return Result{}, fmt.Errorf("kernels: compile %s: %w", src.Name, err)
	}
	res.Log = RewriteLog(out.Log, files)
	res.LoweredNames = out.Lowered
	res.setImage(out.Image, opts.PTX)
	if c.cache != nil {
		res.CacheErr = c.cache.Put(key, encodePayload(out.Image, out.Lowered, res.Log))
	}
	return res, nil
}

func (r *Result) setImage(img []byte, ptx bool) {
	if ptx {
		r.PTX = img
	} else {
		r.Cubin = img
	}
}

// Payload of a cache entry written by Compiler (inside the Cache's checked
// envelope), integers little-endian:
//
//	"GKR1"
//	u32 n, then n times: u32 len, name expression; u32 len, lowered name
//	u32 len, log
//	image (the rest)
const payloadMagic = "GKR1"

func encodePayload(img []byte, lowered map[string]string, log string) []byte {
	b := []byte(payloadMagic)
	names := make([]string, 0, len(lowered))
	for k := range lowered {
		names = append(names, k)
	}
	sort.Strings(names)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		b = appendString(b, lowered[k])
	}
	b = appendString(b, log)
	return append(b, img...)
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

var errPayload = errors.New("kernels: malformed cache payload")

// decodePayload is the inverse of encodePayload (it accepts exactly what
// encodePayload writes); it never panics.
func decodePayload(b []byte) (img []byte, lowered map[string]string, log string, err error) {
	if len(b) < 8 || string(b[:4]) != payloadMagic {
		return nil, nil, "", errPayload
	}
	b = b[4:]
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b))/8 {
		return nil, nil, "", errPayload
	}
	readString := func() (string, bool) {
		if len(b) < 4 {
			return "", false
		}
		l := binary.LittleEndian.Uint32(b)
		if uint64(l) > uint64(len(b)-4) {
			return "", false
		}
		s := string(b[4 : 4+l])
		b = b[4+l:]
		return s, true
	}
	if n > 0 {
		lowered = make(map[string]string, n)
	}
	prev := ""
	for i := uint32(0); i < n; i++ {
		k, ok1 := readString()
		v, ok2 := readString()
		if !ok1 || !ok2 || (i > 0 && k <= prev) { // names strictly ascending, as written
			return nil, nil, "", errPayload
		}
		lowered[k], prev = v, k
	}
	log, ok := readString()
	if !ok {
		return nil, nil, "", errPayload
	}
	return b, lowered, log, nil
}
