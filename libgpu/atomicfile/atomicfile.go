// Package atomicfile writes files the way every gpukit tool must: whole or
// not at all (a temporary file beside the target, renamed over it), with
// errors that name the file the user asked for and never the temporary
// one, and no temporary file left behind by a failure. A kill -9 between
// creating and renaming the temporary file can still leave one; its name
// is "."+base+".tmp*" so that callers can find and remove such litter
// (Litter).
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Options say how Write finishes the file.
type Options struct {
	// Perm is the file's mode (0644 when zero).
	Perm fs.FileMode
	// Sync flushes the file and then its directory to stable storage, so
	// the rename survives a power loss (checkpoints; not needed for plots).
	Sync bool
}

// Write creates path through a temporary file in its directory: write
// fills it, then it is chmodded, optionally synced, closed and renamed over
// path. Any failure removes the temporary file and returns an error that
// names path (PlainErr drops the temporary name) and wraps the cause, so
// errors.Is(err, fs.ErrNotExist) and the like still work; an error that
// write returns is passed on wrapped the same way.
func Write(path string, o Options, write func(w io.Writer) error) (err error) {
	fail := func(err error) error { return fmt.Errorf("writing %s: %w", path, PlainErr(err)) }
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	perm := o.Perm
	if perm == 0 {
		perm = 0o644
	}
	if err = tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err = write(tmp); err != nil {
		return fail(err)
	}
	if o.Sync {
		if err = tmp.Sync(); err != nil {
			return fail(fmt.Errorf("fsync: %w", PlainErr(err)))
		}
	}
	if err = tmp.Close(); err != nil {
		return fail(err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fail(err)
	}
	if o.Sync {
		d, derr := os.Open(dir)
		if derr != nil {
			return fmt.Errorf("fsync directory %s: %w", dir, PlainErr(derr))
		}
		defer d.Close()
		if derr = d.Sync(); derr != nil {
			return fmt.Errorf("fsync directory %s: %w", dir, PlainErr(derr))
		}
	}
	return nil
}

// Litter lists the temporary files Write leaves for path when killed
// before the rename ("."+base+".tmp*" in path's directory).
func Litter(path string) ([]string, error) {
	return filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp*"))
}

// PlainErr is err without the file names an *fs.PathError or
// *os.LinkError carries (a temporary file's, which means nothing to the
// user); the cause stays, so errors.Is still sees it.
func PlainErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
