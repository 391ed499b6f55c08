package objecthost

import (
	"encoding/json"
	"time"
)

// Object states. They match the catalog's (fsm.StateActive, fsm.StateDeleted).
const (
	StateActive  = "active"
	StateDeleted = "deleted"
)

// Options are per-database settings given at init.
type Options struct {
	// HeartbeatIntervalMs overrides the heartbeat interval for this database:
	// 0 uses the account's or the host's default, -1 disables heartbeats.
	HeartbeatIntervalMs int64 `json:"heartbeat_interval_ms,omitempty"`
}

// Meta is the durable metadata of one object. Values are immutable once
// published (a mutation stores a new *Meta), so readers may hold one
// without locking.
type Meta struct {
	ObjectID          string    `json:"object_id"`
	DatabaseUUID      string    `json:"database_uuid"`
	AccountID         string    `json:"account_id"`
	Name              string    `json:"name"`
	Region            string    `json:"region,omitempty"`
	Jurisdiction      string    `json:"jurisdiction,omitempty"`
	State             string    `json:"state"`
	Confirmed         bool      `json:"confirmed"`
	CreatedAt         time.Time `json:"created_at"`
	DeletedAt         time.Time `json:"deleted_at,omitzero"`
	RoutingGeneration int64     `json:"routing_generation"`
	Options           Options   `json:"options,omitzero"`
}

func (m *Meta) deleted() bool { return m.State == StateDeleted }

// ObjectInfo is the API's view of an object (the contract's ObjectInfo).
type ObjectInfo struct {
	ObjectID          string `json:"object_id"`
	DatabaseUUID      string `json:"database_uuid"`
	AccountID         string `json:"account_id"`
	Name              string `json:"name"`
	State             string `json:"state"`
	Confirmed         bool   `json:"confirmed"`
	CreatedAt         string `json:"created_at"`
	RoutingGeneration int64  `json:"routing_generation"`
	FileSize          int64  `json:"file_size"`
	NumTables         int    `json:"num_tables"`
}

// InitRequest is the body of POST /v1/objects/{id}/init.
type InitRequest struct {
	DatabaseUUID      string  `json:"database_uuid"`
	AccountID         string  `json:"account_id"`
	Name              string  `json:"name"`
	Region            string  `json:"region"`
	Jurisdiction      string  `json:"jurisdiction"`
	RoutingGeneration int64   `json:"routing_generation"`
	Options           Options `json:"options"`
}

func encodeMeta(m *Meta) ([]byte, error) { return json.Marshal(m) }

func decodeMeta(b []byte) (*Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &m, nil
}
