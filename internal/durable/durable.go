// Package durable writes files so that a crash leaves either the old
// content or the new one, never a torn file, and a returned nil means the
// new content survives a power loss: a temporary file in the same
// directory, fsynced, renamed over the target, then the directory fsynced.
// The rename is the checkpoint.
package durable

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with what write puts in a temporary file of the
// same directory (see the package comment). The directory must exist.
func WriteFile(path string, write func(f *os.File) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: a no-op
	err = write(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = SyncDir(dir)
	}
	return err
}

// WriteBytes is WriteFile writing b.
func WriteBytes(path string, b []byte) error {
	return WriteFile(path, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// SyncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
