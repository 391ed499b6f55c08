package objecthost

import (
	"encoding/json"
	"github.com/shoaldb/shoal/pipeline/event"
	"time"
)

// Object states. They match the catalog's (fsm.StateActive, fsm.StateDeleted).
const (
	StateActive  = "active"
	StateDeleted = "deleted"
)

// Options are the per-database options an object persists at init
// (event.InitOptions: the API type, defined once for edges and hosts).
type Options = event.InitOptions

// Meta is the durable metadata of one object. Values are immutable once
// published (a mutation stores a new *Meta), so readers may hold one
// without locking.
type Meta struct {
	ObjectID     string    `json:"object_id"`
	DatabaseUUID string    `json:"database_uuid"`
	AccountID    string    `json:"account_id"`
	Name         string    `json:"name"`
	Region       string    `json:"region,omitempty"`
	Jurisdiction string    `json:"jurisdiction,omitempty"`
	State        string    `json:"state"`
	Confirmed    bool      `json:"confirmed"`
	CreatedAt    time.Time `json:"created_at"`
	DeletedAt    time.Time `json:"deleted_at,omitzero"`
	// Superseded: deleted because the catalog named a newer object of the
	// database on another host (relocated.go): its database lives on, so
	// a restored catalog naming this object again is not a resurrection
	// of a deleted database (resurrected.go).
	Superseded bool `json:"superseded,omitempty"`
	// CatalogDeleted: deleted because the catalog deleted the database
	// (the API's delete, or a heartbeat answering "deleted"), so the
	// archive gets its delete marker (deletemark.go); ArchiveMarked: the
	// marker is written (until then the sweep keeps the record).
	CatalogDeleted    bool    `json:"catalog_deleted,omitempty"`
	ArchiveMarked     bool    `json:"archive_marked,omitempty"`
	RoutingGeneration int64   `json:"routing_generation"`
	Options           Options `json:"options,omitzero"`
	// Restoring is set from an init with RestoreFrom until the restored
	// file is in place (restorefrom.go): the object cannot be opened
	// meanwhile, and an init retry resumes the restore.
	Restoring *RestoreSource `json:"restoring,omitempty"`
	// Binding tokens revoked on this object (bindings.go): every token
	// minted at an epoch below BindingEpoch, and the tokens listed in
	// RevokedBindings (sorted by ID) until they would have expired.
	BindingEpoch    int64            `json:"binding_epoch,omitempty"`
	RevokedBindings []RevokedBinding `json:"revoked_bindings,omitempty"`
}

// RevokedBinding is one revoked binding token: its ID and until when it
// must be refused (Unix seconds: the latest its expiry can be).
type RevokedBinding struct {
	ID    string `json:"id"`
	Until int64  `json:"until"`
}

func (m *Meta) deleted() bool { return m.State == StateDeleted }

// ObjectInfo is the API's view of an object and InitRequest the body of
// POST /v1/objects/{id}/init: the host API types, defined once in
// pipeline/event for hosts and edges.
type (
	ObjectInfo    = event.ObjectInfo
	InitRequest   = event.InitRequest
	RestoreSource = event.RestoreSource
)

func encodeMeta(m *Meta) ([]byte, error) { return json.Marshal(m) }

func decodeMeta(b []byte) (*Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &m, nil
}
