package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
)

// CommandVersion is the version of the command encoding written by this
// build. Apply refuses commands with a higher version (a newer proposer) with
// ErrUnsupportedVersion, leaving the catalog unchanged.
const CommandVersion = 1

// CommandType names one kind of catalog mutation.
type CommandType string

// The catalog's commands. Each has a body type below of the same name.
const (
	CmdCreateAccount    CommandType = "create_account"
	CmdUpdateAccount    CommandType = "update_account"
	CmdCreateToken      CommandType = "create_token"
	CmdRevokeToken      CommandType = "revoke_token"
	CmdRegisterHost     CommandType = "register_host"
	CmdReportHostLoad   CommandType = "report_host_load"
	CmdCreateDatabase   CommandType = "create_database"
	CmdDeleteDatabase   CommandType = "delete_database"
	CmdUpdateDatabase   CommandType = "update_database"
	CmdSetDatabaseStats CommandType = "set_database_stats"
	CmdDrainStats       CommandType = "drain_stats"
	CmdNoop             CommandType = "noop"
)

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

// Error is a refusal that travels across the wire. Code is one of the Code*
// constants; Error() maps back to the sentinel errors with errors.Is.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Is makes errors.Is(e, ErrNameTaken) etc. work after a round trip.
func (e *Error) Is(target error) bool {
	s, ok := codes[e.Code]
	return ok && s == target
}

// Error codes, stable across versions.
const (
	CodeInvalid            = "invalid"
	CodeUnknownCommand     = "unknown_command"
	CodeUnsupportedVersion = "unsupported_version"
	CodeNotFound           = "not_found"
	CodeAccountNotFound    = "account_not_found"
	CodeNameTaken          = "name_taken"
	CodeDatabaseLimit      = "database_limit"
	CodeExists             = "exists"
)

// Sentinel errors callers branch on.
var (
	ErrInvalid            = errors.New("invalid command")
	ErrUnknownCommand     = errors.New("unknown command type")
	ErrUnsupportedVersion = errors.New("unsupported command version")
	ErrNotFound           = errors.New("not found")
	ErrAccountNotFound    = errors.New("account not found")
	ErrNameTaken          = errors.New("database name already taken in account")
	ErrDatabaseLimit      = errors.New("account database limit reached")
	ErrExists             = errors.New("already exists")
)

var codes = map[string]error{
	CodeInvalid:            ErrInvalid,
	CodeUnknownCommand:     ErrUnknownCommand,
	CodeUnsupportedVersion: ErrUnsupportedVersion,
	CodeNotFound:           ErrNotFound,
	CodeAccountNotFound:    ErrAccountNotFound,
	CodeNameTaken:          ErrNameTaken,
	CodeDatabaseLimit:      ErrDatabaseLimit,
	CodeExists:             ErrExists,
}

// ToError converts an error from Apply into its wire form, keeping the
// sentinel's code. Unknown errors become CodeInvalid.
func ToError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	// A fixed order, not the map's: Apply stores results in the catalog, so
	// an error wrapping two sentinels must map to the same code everywhere.
	for _, code := range []string{CodeUnsupportedVersion, CodeUnknownCommand, CodeAccountNotFound,
		CodeNameTaken, CodeDatabaseLimit, CodeExists, CodeNotFound, CodeInvalid} {
		if errors.Is(err, codes[code]) {
			return &Error{Code: code, Message: err.Error()}
		}
	}
	return &Error{Code: CodeInvalid, Message: err.Error()}
}

// Command bodies. Field validation rules are enforced in Apply (and by the
// client before proposing): IDs are non-empty and at most 64 bytes, UUIDs are
// canonical lowercase RFC 4122 text, names follow D1's rules (lowercase
// letters, digits, '-' and '_', 1..64 bytes).

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

type CreateAccount struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Tier   string `json:"tier"` // "free" | "paid"
	Limits Limits `json:"limits"`
}

type UpdateAccount struct {
	ID     string  `json:"id"`
	Tier   *string `json:"tier,omitempty"`
	Limits *Limits `json:"limits,omitempty"`
}

type CreateToken struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"` // empty for an admin token
	Hash      string `json:"hash"`       // hex SHA-256 of the secret; the secret is never stored
	Name      string `json:"name"`
	Admin     bool   `json:"admin"`
}

type RevokeToken struct {
	ID string `json:"id"`
}

type RegisterHost struct {
	ID           string `json:"id"`
	Address      string `json:"address"`
	Region       string `json:"region"`
	Jurisdiction string `json:"jurisdiction"`
	Capacity     int64  `json:"capacity"`
	State        string `json:"state"` // "active" | "draining" | "down"
}

type ReportHostLoad struct {
	ID        string `json:"id"`
	Databases int64  `json:"databases"`
	Bytes     int64  `json:"bytes"`
}

type CreateDatabase struct {
	UUID            string `json:"uuid"`
	AccountID       string `json:"account_id"`
	Name            string `json:"name"`
	ObjectID        string `json:"object_id"`
	HostID          string `json:"host_id"`
	Region          string `json:"region"`
	Jurisdiction    string `json:"jurisdiction"`
	ReadReplication string `json:"read_replication"` // "auto" | "disabled"
}

type DeleteDatabase struct {
	AccountID string `json:"account_id"`
	UUID      string `json:"uuid"`
}

type UpdateDatabase struct {
	AccountID       string  `json:"account_id"`
	UUID            string  `json:"uuid"`
	ReadReplication *string `json:"read_replication,omitempty"`
}

// DatabaseStat is one database's size as its host measured it. Seq is the
// measurement's sequence (event.Size.Seq: increasing per database on its
// host, ≥ 0): the catalog keeps a size only if its Seq is greater than the
// stored one, so a size delivered late, twice or out of order never moves
// a total backwards. Seq 0 means "unsequenced" (entries written before
// sequences existed): it is kept while the stored seq is 0 too, the old
// last-writer-wins, and ignored once the database has a sequenced size.
type DatabaseStat struct {
	UUID      string `json:"uuid"`
	SizeBytes int64  `json:"size_bytes"`
	Seq       int64  `json:"seq"`
}

// SetDatabaseStats records the latest size of many databases at once (the
// storage consumer batches them), in order: of two stats for one database
// in one command, the later wins only if its Seq is greater. The size
// differences of the kept sizes are appended to
// account_database_stats_changes in the same transaction (summed per
// account for updates). Unknown or deleted databases are skipped and stale
// sizes ignored, not errors.
type SetDatabaseStats struct {
	Stats []DatabaseStat `json:"stats"`
}

// DrainStats moves up to Max change-log rows (0: all) into
// account_database_stats, one update per account.
type DrainStats struct {
	Max int `json:"max"`
}

// Catalog rows as readers see them.

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
}

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
}

// HeartbeatAnswer answers a heartbeat batch: one state per database and, once
// per account seen, the account's limits and drained storage total.
type HeartbeatAnswer struct {
	Databases []HeartbeatState   `json:"databases"`
	Accounts  map[string]Account `json:"accounts"`
}
