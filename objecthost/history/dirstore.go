package history

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/shoaldb/shoal/internal/durable"
)

// DirStore is a Store in a local directory, the default archive of `shoal
// dev`. It must be outside the host's data dir (it stands in for
// off-host storage: wiping the data dir must not wipe the archive). Put
// writes a temporary file, fsyncs it, renames it into place and fsyncs the
// directory, so an object is complete or absent after a crash. When the
// object comes from a file on the same filesystem (the shipper's sealed
// segments and snapshots, which are never written again), Put fsyncs that
// file and hard-links it instead of copying it: the archive then costs no
// second write of every byte on the same disk.
type DirStore struct {
	root    string
	linkSeq atomic.Int64 // makes putLink's temporary names unique
}

var _ Store = (*DirStore)(nil)

// NewDirStore returns a DirStore rooted at dir (created if missing).
func NewDirStore(dir string) (*DirStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("history: dir store: %w", err)
	}
	return &DirStore{root: dir}, nil
}

func (s *DirStore) path(key string) string { return filepath.Join(s.root, filepath.FromSlash(key)) }

func (s *DirStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := s.path(key)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("history: put %s: %w", key, err)
	}
	if f, ok := r.(*os.File); ok {
		if err := s.putLink(f, size, p, dir); err == nil {
			return nil
		}
		// Another filesystem (or no links): copy from the descriptor,
		// which nothing has read yet.
	}
	tmp, err := os.CreateTemp(dir, ".put-*")
	if err != nil {
		return fmt.Errorf("history: put %s: %w", key, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	n, err := io.Copy(tmp, r)
	if err == nil && n != size {
		err = fmt.Errorf("wrote %d bytes, want %d", n, size)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("history: put %s: %w", key, err)
	}
	return nil
}

// putLink puts f at p as a hard link: fsync f, link it under a temporary
// name, check it is the file of size bytes that f is, rename it into place,
// fsync the directory.
func (s *DirStore) putLink(f *os.File, size int64, p, dir string) error {
	fi, err := f.Stat()
	if err != nil || fi.Size() != size || !fi.Mode().IsRegular() {
		return errors.New("history: not a linkable file")
	}
	if err := f.Sync(); err != nil {
		return err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".put-%d-%d", os.Getpid(), s.linkSeq.Add(1)))
	if err := os.Link(f.Name(), tmp); err != nil {
		return err
	}
	defer os.Remove(tmp) // no-op after the rename
	if li, err := os.Stat(tmp); err != nil || !os.SameFile(fi, li) {
		return errors.New("history: the linked file is not the one opened")
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return syncDir(dir)
}

func (s *DirStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.Open(s.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("history: get %s: %w", key, err)
	}
	return f, nil
}

func (s *DirStore) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Walk the deepest directory the prefix names completely.
	base := prefix
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		base = prefix[:i]
	} else {
		base = ""
	}
	var keys []string
	err := filepath.WalkDir(s.path(base), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".put-") {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		if k := filepath.ToSlash(rel); strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("history: list %s: %w", prefix, err)
	}
	sort.Strings(keys)
	return keys, nil
}

func (s *DirStore) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("history: delete %s: %w", key, err)
	}
	return nil
}

// ListDatabases lists the top-level directories (DatabaseLister).
func (s *DirStore) ListDatabases(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("history: list databases: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// pruneDirs removes the empty directories left under db after
// Archive.DeleteAll (deepest first; a directory a concurrent Put filled
// again is not empty and stays).
func (s *DirStore) pruneDirs(db string) {
	root := s.path(db)
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i]) // fails on a non-empty directory, as wanted
	}
}

func syncDir(dir string) error { return durable.SyncDir(dir) }
