package raftmeta

import (
	"errors"
	"fmt"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Sentinel errors of the Raft layer. Catalog refusals are the sentinel errors
// of package fsm (fsm.ErrNameTaken, …); both survive a trip over the internal
// HTTP API, so errors.Is works on what a Client returns.
var (
	// ErrUnavailable means no node could serve the request: none reachable,
	// no leader elected, or the leader changed more often than the retry
	// budget allowed. It is retryable.
	ErrUnavailable = errors.New("catalog unavailable")
	// ErrTooStale means a stale read was refused because the node has not
	// heard from a leader within the allowed staleness.
	ErrTooStale = errors.New("catalog replica too stale")
	// ErrNotReady means a stale read was refused because the node has not
	// applied the commit index the leader last told it: it is replaying its
	// log after a start, or catching up. Its catalog may lack rows the
	// cluster committed long ago, so it answers nothing rather than
	// "unknown"; clients move on to another node.
	ErrNotReady = errors.New("catalog replica not ready")
	// ErrNotLeader means a leader-only operation reached a follower. The
	// error carries the leader's HTTP address when one is known
	// (see NotLeaderError).
	ErrNotLeader = errors.New("not the leader")
	// ErrClosed means the node is shutting down.
	ErrClosed = errors.New("node closed")
)

// Wire codes of the Raft layer, alongside fsm's Code* constants.
const (
	CodeNotLeader   = "not_leader"
	CodeTooStale    = "too_stale"
	CodeNotReady    = "not_ready"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
	CodeTooLarge    = "too_large"
)

// NotLeaderError is returned for leader-only operations on a follower.
// Leader is the leader's HTTP address ("" when none is known).
type NotLeaderError struct {
	Leader   string
	LeaderID string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "not the leader and no leader is known"
	}
	return fmt.Sprintf("not the leader; the leader is %s at %s", e.LeaderID, e.Leader)
}

func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// wireError is the JSON body of every error answer.
type wireError struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Leader   string `json:"leader,omitempty"`
	LeaderID string `json:"leader_id,omitempty"`
}

// toWire classifies err for the wire, keeping fsm codes.
func toWire(err error) (int, wireError) {
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		return 421, wireError{Code: CodeNotLeader, Message: err.Error(), Leader: nl.Leader, LeaderID: nl.LeaderID}
	case errors.Is(err, ErrTooStale):
		return 503, wireError{Code: CodeTooStale, Message: err.Error()}
	case errors.Is(err, ErrNotReady):
		return 503, wireError{Code: CodeNotReady, Message: err.Error()}
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed):
		return 503, wireError{Code: CodeUnavailable, Message: err.Error()}
	}
	var fe *fsm.Error
	if errors.As(err, &fe) {
		return statusForCode(fe.Code), wireError{Code: fe.Code, Message: fe.Message}
	}
	if fsm.IsRefusal(err) { // an fsm sentinel, wrapped (reads, request validation)
		w := fsm.ToError(err)
		return statusForCode(w.Code), wireError{Code: w.Code, Message: w.Message}
	}
	return 500, wireError{Code: CodeInternal, Message: "internal error"}
}

func statusForCode(code string) int {
	switch code {
	case fsm.CodeNotFound, fsm.CodeAccountNotFound:
		return 404
	case fsm.CodeNameTaken, fsm.CodeExists, fsm.CodeDatabaseLimit:
		return 409
	case CodeTooLarge:
		return 413
	}
	return 400
}

// fromWire maps an error answer back to a Go error that errors.Is
// recognises: fsm sentinels for catalog codes, this package's otherwise.
func fromWire(w wireError) error {
	switch w.Code {
	case CodeNotLeader:
		return &NotLeaderError{Leader: w.Leader, LeaderID: w.LeaderID}
	case CodeTooStale:
		return fmt.Errorf("%w: %s", ErrTooStale, w.Message)
	case CodeNotReady:
		return fmt.Errorf("%w: %s", ErrNotReady, w.Message)
	case CodeUnavailable:
		return fmt.Errorf("%w: %s", ErrUnavailable, w.Message)
	case CodeInternal, "":
		return fmt.Errorf("catalog internal error: %s", w.Message)
	case CodeTooLarge:
		return &fsm.Error{Code: fsm.CodeInvalid, Message: w.Message}
	case CodeForbidden:
		return fmt.Errorf("%w: %s", ErrForbidden, w.Message)
	}
	return &fsm.Error{Code: w.Code, Message: w.Message}
}
