package fsm

import (
	"encoding/json"
	"fmt"
)

// CommandVersion is the version of the command encoding written by this
// build. Apply refuses commands with a higher version (a newer proposer) with
// ErrUnsupportedVersion, leaving the catalog unchanged.
const CommandVersion = 1

// CommandType names one kind of catalog mutation. Each command is defined
// in its own file, cmd_<type>.go (its CommandType constant, body type,
// validation, apply function, prepared statements and refusals), and
// registered in commands (registry.go).
type CommandType string

// Command is the envelope of every entry in the Raft log.
//
// Commands are deterministic: RequestID and Time are chosen by the proposer
// (never by Apply), so every replica applying the same log reaches the same
// catalog. RequestID deduplicates retries: a command whose RequestID was
// applied recently is not applied again and is answered with the original
// Result.
type Command struct {
	Version   int             `json:"v"`
	Type      CommandType     `json:"type"`
	RequestID string          `json:"rid"`
	Time      int64           `json:"ts"` // proposer's clock, Unix nanoseconds
	Body      json.RawMessage `json:"body"`
	// Audit names who proposed the command and from where, for the audit
	// log (audit.go); absent: recorded as "unknown".
	Audit *Audit `json:"audit,omitempty"`
}

// NewCommand builds a command of the current version with body encoded.
func NewCommand(t CommandType, requestID string, unixNano int64, body any) (Command, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return Command{}, fmt.Errorf("encode %s body: %w", t, err)
	}
	return Command{Version: CommandVersion, Type: t, RequestID: requestID, Time: unixNano, Body: b}, nil
}

// Result is what Apply returns for one command (raft.ApplyFuture.Response()).
// Err is set when the command was refused; the catalog is then unchanged.
type Result struct {
	Index uint64          `json:"index"`
	Value json.RawMessage `json:"value,omitempty"`
	Err   *Error          `json:"error,omitempty"`
}

// Catalog rows as readers see them.

// Limits are an account's limits. Zero means "use the tier default" is not
// applied here: the proposer fills every field.
type Limits struct {
	MaxDatabases        int64 `json:"max_databases"`
	MaxStorageBytes     int64 `json:"max_storage_bytes"`
	MaxDatabaseBytes    int64 `json:"max_database_bytes"`
	RowsReadPerDay      int64 `json:"rows_read_per_day"`
	RowsWrittenPerDay   int64 `json:"rows_written_per_day"`
	HeartbeatIntervalMs int64 `json:"heartbeat_interval_ms"` // 0: host default; -1: disabled
}

type Account struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	Tier            string `json:"tier"`
	Limits          Limits `json:"limits"`
	ActiveDatabases int64  `json:"active_databases"`
	StorageBytes    int64  `json:"storage_bytes"` // from account_database_stats (drained)
	CreatedAt       int64  `json:"created_at"`    // Unix nanoseconds
}

type Token struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Name      string `json:"name"`
	Admin     bool   `json:"admin"`
	Revoked   bool   `json:"revoked"`
	CreatedAt int64  `json:"created_at"`
	// Scope is ScopeEdit (read and write, the default) or ScopeRead.
	Scope string `json:"scope,omitempty"`
	// Databases, when not empty, are the only databases (UUIDs) the token
	// may see or touch.
	Databases []string `json:"databases,omitempty"`
	// ExpiresAt is when the token stops working (Unix ns; 0: never).
	ExpiresAt int64 `json:"expires_at,omitempty"`
}

// Token scopes (Cloudflare's D1 Read and D1 Edit).
const (
	ScopeEdit = "edit"
	ScopeRead = "read"
)

// maxTokenDatabases bounds a token's database list.
const maxTokenDatabases = 100

type Host struct {
	ID           string `json:"id"`
	Address      string `json:"address"`
	Region       string `json:"region"`
	Jurisdiction string `json:"jurisdiction"`
	Capacity     int64  `json:"capacity"`
	State        string `json:"state"`
	Databases    int64  `json:"databases"`
	Bytes        int64  `json:"bytes"`
	UpdatedAt    int64  `json:"updated_at"`
}

// Database states.
const (
	StateActive  = "active"
	StateDeleted = "deleted"
)

type Database struct {
	UUID              string `json:"uuid"`
	AccountID         string `json:"account_id"`
	Name              string `json:"name"`
	ObjectID          string `json:"object_id"`
	HostID            string `json:"host_id"`
	HostAddress       string `json:"host_address"` // joined from hosts
	Region            string `json:"region"`
	Jurisdiction      string `json:"jurisdiction"`
	ReadReplication   string `json:"read_replication"`
	State             string `json:"state"`
	CreatedAt         int64  `json:"created_at"`
	DeletedAt         int64  `json:"deleted_at,omitempty"`
	RoutingGeneration int64  `json:"routing_generation"`
	SizeBytes         int64  `json:"size_bytes"` // latest database_stats
}

// HeartbeatState is the catalog's answer for one database in a heartbeat
// batch. Known is false when the catalog has no row for the UUID.
type HeartbeatState struct {
	UUID              string `json:"uuid"`
	Known             bool   `json:"known"`
	State             string `json:"state,omitempty"`
	AccountID         string `json:"account_id,omitempty"`
	RoutingGeneration int64  `json:"routing_generation,omitempty"`
	// ObjectID is the object the catalog names for the database. A host
	// whose object for the UUID is another one learns from it that its
	// object was superseded (lost-host recovery relocated the database) or
	// is the leftover of a relocation that never committed. Empty from a
	// catalog older than the field: hosts then compare nothing.
	ObjectID string `json:"object_id,omitempty"`
	// DeletedAt is when a deleted database was deleted (Unix ns, the
	// delete command's time; 0 otherwise): an object host sweeps the
	// database's archive once its time-travel retention passed since.
	DeletedAt int64 `json:"deleted_at,omitempty"`
}

// HeartbeatAnswer answers a heartbeat batch: one state per database and, once
// per account seen, the account's limits and drained storage total.
type HeartbeatAnswer struct {
	Databases []HeartbeatState   `json:"databases"`
	Accounts  map[string]Account `json:"accounts"`
	// CatalogRestores is how many times the catalog was restored from a
	// backup (CmdCatalogRestored), as of the answer: a host that sees it
	// grow republishes its databases' sizes. 0 from a catalog never
	// restored, or older than the field.
	CatalogRestores int64 `json:"catalog_restores,omitempty"`
}
