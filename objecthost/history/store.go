package history

import (
	"context"
	"errors"
	"io"
)

// Store is the off-host archive the shipper writes and restore reads: an
// S3-compatible bucket in production (S3Store), a directory outside the
// host's data dir in `shoal dev` (DirStore).
//
// Contract:
//   - Put makes the object under key visible atomically and durably before
//     it returns nil: a reader sees no object or all size bytes of it, and
//     after nil the object survives the loss of this host. Objects are
//     immutable: the shipper only ever Puts a key again with the same bytes
//     (re-shipping after a crash), which must succeed.
//   - Get returns ErrNotFound (wrapped) for a missing key.
//   - List returns every key that starts with prefix, ascending, complete
//     (implementations page through the whole listing). It may miss objects
//     whose Put has not returned yet, never ones whose Put returned.
//   - Delete removes key; a missing key is not an error.
//   - All methods are safe for concurrent use and honour ctx.
//
// Keys are '/'-separated and made of [0-9a-zA-Z._-] (see keys.go).
type Store interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	List(ctx context.Context, prefix string) ([]string, error)
	Delete(ctx context.Context, key string) error
}

// ErrNotFound is returned by Store.Get for a missing key.
var ErrNotFound = errors.New("history: object not found")
