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

// Batched lifecycle calls: POST /v1/batch/init and /v1/batch/confirm carry
// the inits or confirms of up to MaxHostBatch objects in one request (an
// edge coalesces concurrent creates, edge/createbatch.go). Each item is
// handled exactly as its own call would be — same checks, same checkpoint,
// its own answer — and the answer lists one BatchItemAnswer per item, in
// order. A host without these routes answers 404; the edge then sends the
// calls one by one.

// MaxHostBatch bounds the items of one batched lifecycle request.
const MaxHostBatch = 256

// InitBatchRequest is the body of POST /v1/batch/init. Inits restoring from
// an archive (RestoreFrom) are refused in a batch: they take as long as
// the restore and go alone.
type InitBatchRequest struct {
	Inits []InitBatchItem `json:"inits"`
}

// InitBatchItem is one object's init.
type InitBatchItem struct {
	ObjectID string      `json:"object_id"`
	Init     InitRequest `json:"init"`
}

// ConfirmBatchRequest is the body of POST /v1/batch/confirm.
type ConfirmBatchRequest struct {
	Confirms []ConfirmBatchItem `json:"confirms"`
}

// ConfirmBatchItem is one object's confirm: its identity (checked as the
// X-Shoal-Database and X-Shoal-Account headers of a single confirm are)
// and the routing generation the catalog gave it.
type ConfirmBatchItem struct {
	ObjectID          string `json:"object_id"`
	DatabaseUUID      string `json:"database_uuid"`
	AccountID         string `json:"account_id"`
	RoutingGeneration int64  `json:"routing_generation"`
}

// BatchAnswer is the result of a batched lifecycle request.
type BatchAnswer struct {
	Items []BatchItemAnswer `json:"items"`
}

// BatchItemAnswer is one item's answer: empty on success (the edge needs
// no more of an init or confirm than that it happened, and decoding an
// ObjectInfo per item showed in the edge's profile of batched confirms), else
// Error with the status and v4 code the single call would have answered.
type BatchItemAnswer struct {
	Error *BatchItemError `json:"error,omitempty"`
}

// BatchItemError is an item's refusal.
type BatchItemError struct {
	Status  int    `json:"status"`
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// LocatedObject is one object a host holds for a database, as GET
// /v1/databases/{uuid}/objects reports it from the host's in-memory index:
// the edge's last-resort route lookup when neither its cache nor the
// catalog can answer (edge/hostroute.go).
type LocatedObject struct {
	ObjectID          string `json:"object_id"`
	AccountID         string `json:"account_id"`
	State             string `json:"state"`
	RoutingGeneration int64  `json:"routing_generation"`
	Confirmed         bool   `json:"confirmed"`
}

// LocateAnswer is the result of GET /v1/databases/{uuid}/objects.
type LocateAnswer struct {
	Objects []LocatedObject `json:"objects"`
}
