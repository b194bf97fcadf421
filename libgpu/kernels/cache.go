package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Cache entry layout (all integers little-endian), format version 1:
//
//	offset size field
//	     0    8 magic "GPUKITKC"
//	     8    4 format version (1)
//	    12    4 header length in bytes (120)
//	    16   64 key, 64 lower-case hex digits, equal to the file name
//	    80    8 payload length in bytes
//	    88   32 sha256 of the payload
//	   120    n payload
//
// A reader checks every field and the payload's sha256, so a truncated file,
// a flipped bit anywhere, or an entry renamed to another key is detected.
const (
	entryMagic     = "GPUKITKC"
	entryVersion   = 1
	entryHeaderLen = 120
	tempPrefix     = ".tmp-"
)

// Cache is a directory of compiled kernel images addressed by Key. Entries
// are written to a temporary file in the same directory and renamed into
// place, so readers never see a partial entry and concurrent writers of one
// key are safe (the last rename wins; both wrote the same bytes). A Cache is
// safe for concurrent use by several goroutines and processes.
type Cache struct {
	dir                         string
	hits, misses, corrupt, puts atomic.Int64
}

// CacheEntry describes one stored entry.
type CacheEntry struct {
	Key     string
	Size    int64 // payload bytes (file size less the 120-byte header)
	ModTime time.Time
}

// CacheStats are the entries on disk plus this process's counters.
type CacheStats struct {
	Dir     string
	Entries int
	Bytes   int64 // payload bytes of all entries
	Hits    int64 // Get found a good entry (this process)
	Misses  int64 // Get found none, or a corrupt one (this process)
	Corrupt int64 // corrupt entries detected and removed (this process)
	Puts    int64 // entries written (this process)
}

// OpenCache opens (creating it, mode 0755, if needed) the cache at dir.
func OpenCache(dir string) (*Cache, error) {
	if dir == "" {
		return nil, ErrNoCacheDir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kernels: open cache: %w", err)
	}
	return &Cache{dir: dir}, nil
}

// DefaultCacheDir is where the cache lives: $GPUKIT_CACHE_DIR if set, else
// $XDG_CACHE_HOME/gpukit/kernels if XDG_CACHE_HOME is an absolute path (the
// XDG Base Directory Specification says relative values are ignored), else
// $HOME/.cache/gpukit/kernels. It fails with ErrNoCacheDir when none applies.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("GPUKIT_CACHE_DIR"); d != "" {
		return d, nil
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "gpukit", "kernels"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", ErrNoCacheDir
	}
	return filepath.Join(home, ".cache", "gpukit", "kernels"), nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) path(key string) string { return filepath.Join(c.dir, key) }

// Get returns the payload stored under key. A missing entry is (nil, false,
// nil). A corrupt entry is removed and reported as (nil, false, err) with
// errors.Is(err, ErrCorrupt): a miss, plus the reason; callers recompile.
// Other errors are I/O errors.
func (c *Cache) Get(key string) ([]byte, bool, error) {
	if !validKey(key) {
		return nil, false, fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	b, err := os.ReadFile(c.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		c.misses.Add(1)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("kernels: cache get: %w", err)
	}
	payload, err := decodeEntry(b, key)
	if err != nil {
		c.misses.Add(1)
		c.corrupt.Add(1)
		if rmErr := os.Remove(c.path(key)); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			return nil, false, fmt.Errorf("%w (removing it failed: %v)", err, rmErr)
		}
		return nil, false, err
	}
	c.hits.Add(1)
	return payload, true, nil
}

// Put stores data under key atomically (temp file, fsync, rename).
func (c *Cache) Put(key string, data []byte) error {
	if !validKey(key) {
		return fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	f, err := os.CreateTemp(c.dir, tempPrefix+key[:8]+"-*")
	if err != nil {
		return fmt.Errorf("kernels: cache put: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(encodeEntry(key, data))
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp, c.path(key))
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("kernels: cache put: %w", werr)
	}
	c.puts.Add(1)
	return nil
}

// List returns the entries, sorted by key. It reads no payloads (Verify does).
func (c *Cache) List() ([]CacheEntry, error) {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("kernels: cache list: %w", err)
	}
	var out []CacheEntry
	for _, de := range des {
		if de.IsDir() || !validKey(de.Name()) {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		size := info.Size() - entryHeaderLen
		if size < 0 {
			size = 0
		}
		out = append(out, CacheEntry{Key: de.Name(), Size: size, ModTime: info.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Stats counts the entries on disk and reports this process's counters.
func (c *Cache) Stats() (CacheStats, error) {
	es, err := c.List()
	if err != nil {
		return CacheStats{}, err
	}
	s := CacheStats{Dir: c.dir, Entries: len(es), Hits: c.hits.Load(), Misses: c.misses.Load(),
		Corrupt: c.corrupt.Load(), Puts: c.puts.Load()}
	for _, e := range es {
		s.Bytes += e.Size
	}
	return s, nil
}

// Verify reads every entry in full and checks it. It returns the keys of the
// corrupt entries, which it removes (a corrupt entry is never kept: the next
// Get would remove it anyway), each with its reason: "KEY: reason".
func (c *Cache) Verify() (bad []string, err error) {
	es, err := c.List()
	if err != nil {
		return nil, err
	}
	for _, e := range es {
		b, rerr := os.ReadFile(c.path(e.Key))
		if errors.Is(rerr, fs.ErrNotExist) {
			continue
		}
		if rerr != nil {
			return bad, fmt.Errorf("kernels: cache verify: %w", rerr)
		}
		if _, derr := decodeEntry(b, e.Key); derr != nil {
			c.corrupt.Add(1)
			bad = append(bad, e.Key+": "+strings.TrimPrefix(derr.Error(), ErrCorrupt.Error()+": "))
			if rmErr := os.Remove(c.path(e.Key)); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
				return bad, fmt.Errorf("kernels: cache verify: %w", rmErr)
			}
		}
	}
	return bad, nil
}

// Clear removes every entry and every leftover temporary file; it returns
// how many entries it removed. Other files in the directory are left alone.
func (c *Cache) Clear() (int, error) {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return 0, fmt.Errorf("kernels: cache clear: %w", err)
	}
	n := 0
	for _, de := range des {
		name := de.Name()
		if de.IsDir() || !(validKey(name) || strings.HasPrefix(name, tempPrefix)) {
			continue
		}
		if err := os.Remove(filepath.Join(c.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("kernels: cache clear: %w", err)
		}
		if validKey(name) {
			n++
		}
	}
	return n, nil
}

func encodeEntry(key string, payload []byte) []byte {
	b := make([]byte, entryHeaderLen+len(payload))
	copy(b, entryMagic)
	binary.LittleEndian.PutUint32(b[8:], entryVersion)
	binary.LittleEndian.PutUint32(b[12:], entryHeaderLen)
	copy(b[16:80], key)
	binary.LittleEndian.PutUint64(b[80:], uint64(len(payload)))
	sum := sha256.Sum256(payload)
	copy(b[88:120], sum[:])
	copy(b[entryHeaderLen:], payload)
	return b
}

// decodeEntry checks an entry file's bytes against the key it is stored
// under and returns its payload (a sub-slice of b).
func decodeEntry(b []byte, key string) ([]byte, error) {
	if len(b) < entryHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorrupt, len(b))
	}
	if string(b[:8]) != entryMagic {
		return nil, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != entryVersion {
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrCorrupt, v, entryVersion)
	}
	if h := binary.LittleEndian.Uint32(b[12:]); h != entryHeaderLen {
		return nil, fmt.Errorf("%w: header length %d, want %d", ErrCorrupt, h, entryHeaderLen)
	}
	if string(b[16:80]) != key {
		return nil, fmt.Errorf("%w: header names another key", ErrCorrupt)
	}
	n := binary.LittleEndian.Uint64(b[80:])
	if n != uint64(len(b)-entryHeaderLen) {
		return nil, fmt.Errorf("%w: payload is %d bytes, header says %d", ErrCorrupt, len(b)-entryHeaderLen, n)
	}
	payload := b[entryHeaderLen:]
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], b[88:120]) {
		return nil, fmt.Errorf("%w: sha256 mismatch", ErrCorrupt)
	}
	return payload, nil
}
