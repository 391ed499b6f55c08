package fsm

import (
	"errors"
)

// Error is a refusal that travels across the wire. Code is one of the Code*
// constants; Error() maps back to the sentinel errors with errors.Is.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Is makes errors.Is(e, ErrNameTaken) etc. work after a round trip.
func (e *Error) Is(target error) bool {
	for _, r := range refusals {
		if r.Code == e.Code {
			return r.Err == target
		}
	}
	return false
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
	CodeConflict           = "conflict"
	CodeClusterLevelTooLow = "cluster_level_too_low"
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
	// ErrConflict: a compare-and-set command found another state than the
	// one it was written against (relocate_database: the database's object
	// is no longer the one being replaced; delete_database_if: the
	// database is no longer the object or routing generation expected;
	// set_host_state: the host reported after the idle bound).
	ErrConflict = errors.New("conflict")
	// ErrClusterLevelTooLow: the command needs a higher catalog level than
	// the cluster's (cmd_set_cluster_level.go): some catalog node may run
	// a build that does not know it. Nothing was written.
	ErrClusterLevelTooLow = errors.New("cluster catalog level too low")
)

// Refusal is one kind of refusal: its wire code and its sentinel error.
type Refusal struct {
	Code string
	Err  error
}

// refusals is every refusal the catalog can answer, by Apply (Result.Err)
// or by a read, and the only list of them: IsRefusal, RefusalCode, ToError,
// Error.Is and the callers' error mapping (raftmeta's HTTP errors, the
// edge's "final, do not retry" decision) all derive from it. A new refusal
// is one row here plus its Code and Err above, and the commands that can
// return it list it in their definition (see commandSpec).
//
// The order is ToError's, and it is part of the replicated state: Apply
// stores results in the catalog, so an error wrapping two sentinels must
// map to the same code on every replica and in every build. Append new
// rows only where they cannot change how an existing error maps (a new
// sentinel is never wrapped together with an old one).
var refusals = []Refusal{
	{CodeUnsupportedVersion, ErrUnsupportedVersion},
	{CodeUnknownCommand, ErrUnknownCommand},
	{CodeAccountNotFound, ErrAccountNotFound},
	{CodeNameTaken, ErrNameTaken},
	{CodeDatabaseLimit, ErrDatabaseLimit},
	{CodeExists, ErrExists},
	{CodeNotFound, ErrNotFound},
	{CodeInvalid, ErrInvalid},
	{CodeConflict, ErrConflict},
	{CodeClusterLevelTooLow, ErrClusterLevelTooLow},
}

// Refusals returns every refusal the catalog can answer (a copy), in the
// order ToError tries them. Tests of callers iterate over it, so a new
// refusal cannot be left unmapped.
func Refusals() []Refusal { return append([]Refusal(nil), refusals...) }

// IsRefusal reports whether err is a definitive answer of the catalog (one
// of the sentinels above, wrapped or as an *Error with a known code after a
// trip over the wire) rather than a failure to reach it. A refusal left the
// catalog unchanged; retrying the same command gets the same answer.
func IsRefusal(err error) bool {
	_, ok := RefusalCode(err)
	return ok
}

// RefusalCode returns the wire code of a refusal (see IsRefusal) and
// whether err is one.
func RefusalCode(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	for _, r := range refusals {
		if errors.Is(err, r.Err) {
			return r.Code, true
		}
	}
	return "", false
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
	if code, ok := RefusalCode(err); ok {
		return &Error{Code: code, Message: err.Error()}
	}
	return &Error{Code: CodeInvalid, Message: err.Error()}
}
