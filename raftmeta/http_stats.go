package raftmeta

import (
	"context"
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Storage pages for the storage snapshotter (pipeline/snapshot):
//
//	GET /v1/storage/databases?after=UUID&limit=N  → fsm.DatabaseStoragePage
//	GET /v1/storage/accounts?after=ID&limit=N     → fsm.AccountStoragePage
//
// Keyset pages in key order (after = the previous page's next; absent for
// the first page), limit 1..fsm.MaxStoragePage (default
// fsm.DefaultStoragePage), with the usual ?consistency= and &max_stale=;
// the snapshotter reads them stale. A page costs O(log n + limit) on the
// serving node.

// Storage page kinds, the {kind} of the route.
const (
	storageKindDatabases = "databases"
	storageKindAccounts  = "accounts"
)

func (n *Node) handleStorage(w http.ResponseWriter, r *http.Request) {
	kind := mux.Vars(r)["kind"]
	q := r.URL.Query()
	after := q.Get("after")
	limit := fsm.DefaultStoragePage
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > fsm.MaxStoragePage {
			n.writeErr(w, invalid("invalid limit %q: want 1..%d", truncate(s, 20), fsm.MaxStoragePage))
			return
		}
		limit = v
	}
	switch kind {
	case storageKindDatabases:
		if after != "" {
			if err := validUUID(after); err != nil {
				n.writeErr(w, err)
				return
			}
		}
		n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.DatabaseStoragePage(ctx, after, limit) })
	case storageKindAccounts:
		if after != "" {
			if err := validID("after account id", after); err != nil {
				n.writeErr(w, err)
				return
			}
		}
		n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.AccountStoragePage(ctx, after, limit) })
	default:
		n.writeErr(w, &fsm.Error{Code: fsm.CodeNotFound, Message: "no such storage page kind: " + truncate(kind, 40)})
	}
}
