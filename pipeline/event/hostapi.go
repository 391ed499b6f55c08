package event

// The object host's internal API types: edges (edge/hostclient.go) and
// object hosts (objecthost) both use these definitions, so the two sides
// cannot drift (they had: num_tables was an int64 on one side and an int on
// the other). Like the events above, they cross process boundaries; unlike
// them they go over HTTP, not Kafka.

// ObjectInfo is an object's own metadata as its host reports it (init,
// confirm, info, delete answers).
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
	NumTables         int64  `json:"num_tables"`
}

// InitRequest is the body of POST /v1/objects/{id}/init.
type InitRequest struct {
	DatabaseUUID      string      `json:"database_uuid"`
	AccountID         string      `json:"account_id"`
	Name              string      `json:"name"`
	Region            string      `json:"region"`
	Jurisdiction      string      `json:"jurisdiction"`
	RoutingGeneration int64       `json:"routing_generation"`
	Options           InitOptions `json:"options"`
	// RestoreFrom, when set, makes the new object's content a database's
	// archived state instead of empty: a fork (another database, at a
	// bookmark) or a database relocated off a lost host (the same UUID, at
	// its last archived commit). The init answers once the file is in
	// place; the host must run with history (an archive).
	RestoreFrom *RestoreSource `json:"restore_from,omitempty"`
}

// RestoreSource names an archived state: DatabaseUUID's history at
// Bookmark, or at its last archived commit when Bookmark is empty.
// EmptyIfNone accepts a database with no archived history at all (never
// written) and makes the object empty; without it that is refused, so a
// relocation never silently turns a database whose archive is missing
// into an empty one.
type RestoreSource struct {
	DatabaseUUID string `json:"database_uuid"`
	Bookmark     string `json:"bookmark,omitempty"`
	EmptyIfNone  bool   `json:"empty_if_none,omitempty"`
}

// InitOptions are the per-database options an object persists at init.
type InitOptions struct {
	// HeartbeatIntervalMs overrides the heartbeat interval for this
	// database: 0 uses the account's or the host's default, -1 disables
	// heartbeats.
	HeartbeatIntervalMs int64 `json:"heartbeat_interval_ms,omitempty"`
}
