package raftmeta

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// StorageReader is the paged read of the catalog's storage figures that
// the storage snapshotter (pipeline/snapshot) walks once per interval.
//
// Contract: safe for concurrent use. Each call is one page, in key order,
// starting strictly after the key passed ("" for the first page; the
// previous page's Next otherwise; Next is "" on the last page), at most
// fsm.MaxStoragePage rows (limit < 1: fsm.DefaultStoragePage). Pages are
// never cached: each call reads the catalog at the consistency o asks for
// (stale reads are what the snapshotter uses). A walk returns every row
// that existed for its whole duration exactly once; pages of one walk may
// come from different nodes and applied indexes. Errors as in
// CatalogReader.
type StorageReader interface {
	DatabaseStoragePage(ctx context.Context, after string, limit int, o ReadOptions) (fsm.DatabaseStoragePage, error)
	AccountStoragePage(ctx context.Context, after string, limit int, o ReadOptions) (fsm.AccountStoragePage, error)
}

var _ StorageReader = (*Client)(nil)

func storagePageQuery(after string, limit int) url.Values {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(min(limit, fsm.MaxStoragePage)))
	}
	return q
}

// DatabaseStoragePage reads one page of database sizes (see StorageReader).
func (c *Client) DatabaseStoragePage(ctx context.Context, after string, limit int, o ReadOptions) (fsm.DatabaseStoragePage, error) {
	var out fsm.DatabaseStoragePage
	err := c.read(ctx, "", http.MethodGet, "/v1/storage/databases", storagePageQuery(after, limit), nil, o, &out)
	return out, err
}

// AccountStoragePage reads one page of account totals (see StorageReader).
func (c *Client) AccountStoragePage(ctx context.Context, after string, limit int, o ReadOptions) (fsm.AccountStoragePage, error) {
	var out fsm.AccountStoragePage
	err := c.read(ctx, "", http.MethodGet, "/v1/storage/accounts", storagePageQuery(after, limit), nil, o, &out)
	return out, err
}
