package history

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Delete markers: what the archive knows about a database deleted on its
// host. When an object host deletes an object because the catalog deleted
// its database (the API's delete, or a heartbeat answering "deleted"), it
// writes
//
//	<db>/deleted/<object>       {"object_id","deleted_at"}
//
// beside the database's generations. The archive alone then tells that
// the database was deleted, even when the catalog no longer does (a
// catalog restored from an older backup lists it again: a "zombie") and
// the host that deleted it is gone: an init that restores from the
// archive (lost-host recovery, a fork) refuses a database with a marker.
// A database UUID is never reused and the catalog never undeletes one
// except by being restored, so any marker under <db>/ means the database
// was deleted. Objects deleted for other reasons (orphans, leftovers,
// objects superseded by a relocation) get none: their database lives on.
//
// Markers have two path parts under <db>/, so index() (generations are
// <gen>/<kind>/<name>) never sees them; DeleteAll removes them with the
// rest of the archive when the deleted database's retention passed.

// DeleteMark is one delete marker.
type DeleteMark struct {
	ObjectID  string    `json:"object_id"`
	DeletedAt time.Time `json:"deleted_at"`
}

const deleteMarkDir = "deleted"

func deleteMarkKey(db, object string) string { return db + "/" + deleteMarkDir + "/" + object }

// MarkDeleted writes the delete marker of object (of database db, deleted
// at deletedAt). Idempotent: writing it again replaces it with the same
// content. The Put is the checkpoint of "the archive knows": once it
// returned nil, the marker is durable in the store.
func (a *Archive) MarkDeleted(ctx context.Context, db, object string, deletedAt time.Time) error {
	if !validKey(db) || !validKey(object) {
		return fmt.Errorf("history: invalid delete marker key %q/%q", db, object)
	}
	b, err := json.Marshal(DeleteMark{ObjectID: object, DeletedAt: deletedAt.UTC()})
	if err != nil {
		return err
	}
	return a.store.Put(ctx, deleteMarkKey(db, object), bytes.NewReader(b), int64(len(b)))
}

// DeleteMarks answers the delete markers of database db, oldest first
// (none: nil). A marker whose content cannot be read still counts, with
// its object ID from its key and a zero time: its presence is the fact.
func (a *Archive) DeleteMarks(ctx context.Context, db string) ([]DeleteMark, error) {
	if !validKey(db) {
		return nil, fmt.Errorf("history: invalid database key %q", db)
	}
	prefix := db + "/" + deleteMarkDir + "/"
	keys, err := a.store.List(ctx, prefix)
	if err != nil {
		return nil, storeFailed(err) // an outage, never "no marker"
	}
	var out []DeleteMark
	for _, k := range keys {
		obj := strings.TrimPrefix(k, prefix)
		if obj == "" || strings.Contains(obj, "/") {
			continue
		}
		m := DeleteMark{ObjectID: obj}
		if rc, err := a.store.Get(ctx, k); err == nil {
			var got DeleteMark
			if json.NewDecoder(io.LimitReader(rc, 4096)).Decode(&got) == nil && got.ObjectID == obj {
				m = got
			}
			rc.Close()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeletedAt.Before(out[j].DeletedAt) })
	return out, nil
}
