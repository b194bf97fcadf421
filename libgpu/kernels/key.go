package kernels

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sort"
)

// keyDomain separates gpukit cache keys from any other sha256 use and lets a
// change of the key layout invalidate every old entry.
const keyDomain = "gpukit/kernels cache key v1"

// Key is the content address of one compilation: the hex sha256 of the
// source, the options in order, the NVRTC version ("13.0") and the full
// architecture name ("sm_90a", which is not "sm_90": arch-specific targets
// are not forward-compatible). Every field is length-prefixed, so no two
// different inputs frame to the same bytes (["a b"] and ["a", "b"] differ).
// Sources with headers are keyed through KeySource, which folds the headers
// into src.
func Key(src []byte, opts []string, nvrtcVersion string, arch string) string {
	h := sha256.New()
	writeField(h, []byte(keyDomain))
	writeField(h, src)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(opts)))
	h.Write(n[:])
	for _, o := range opts {
		writeField(h, []byte(o))
	}
	writeField(h, []byte(nvrtcVersion))
	writeField(h, []byte(arch))
	return hex.EncodeToString(h.Sum(nil))
}

// KeySource is Key for a Source: the code, its name (NVRTC writes it into
// line info and logs) and every header (sorted by name) all count.
func KeySource(src Source, opts []string, nvrtcVersion, arch string) string {
	return Key(sourceBytes(src), opts, nvrtcVersion, arch)
}

func sourceBytes(src Source) []byte {
	h := sha256.New()
	writeField(h, []byte(src.Name))
	writeField(h, src.Code)
	names := make([]string, 0, len(src.Headers))
	for n := range src.Headers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		writeField(h, []byte(n))
		writeField(h, []byte(src.Headers[n]))
	}
	return h.Sum(nil)
}

func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// validKey reports whether k is 64 lower-case hex digits (what Key returns),
// so a key can never name a path outside the cache directory.
func validKey(k string) bool {
	if len(k) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
