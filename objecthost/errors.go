package objecthost

import (
	"errors"
	"net/http"
	"strings"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// CodeConflict is the v4 code for "this object already holds a different
// database" (init with another database UUID or account). The contract
// (objecthost API) fixes it at 7409; it is local until internal/v4 adopts it.
const CodeConflict = 7409

// Sentinel errors of the host's operations; the HTTP layer maps each to a
// status and v4 code (see statusOf).
var (
	ErrNotFound  = errors.New("database not found")
	ErrDeleted   = errors.New("database deleted")
	ErrWrongHost = errors.New("object does not hold this database")
	ErrConflict  = errors.New("object already holds a different database")
	ErrInvalid   = errors.New("invalid request")
	ErrRowLimit  = errors.New("account has reached its daily rows limit")
	ErrClosed    = errors.New("object host closed")
	ErrBinding   = errors.New("invalid binding token")
)

// statusOf maps an error to its HTTP status, v4 code and user-facing
// message. Internal errors never leak their text (it may hold paths).
func statusOf(err error) (int, int, string) {
	var se *sqlexec.Error
	var he *errHistory
	switch {
	case errors.As(err, &se):
		return sqlStatus(se.Code), se.Code, se.Message
	case errors.As(err, &he):
		return he.status, he.code, he.msg
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, v4.CodeNotFound, ErrNotFound.Error()
	case errors.Is(err, ErrDeletedInArchive):
		return http.StatusGone, v4.CodeDatabaseDeleted, err.Error()
	case errors.Is(err, ErrDeleted):
		return http.StatusGone, v4.CodeDatabaseDeleted, ErrDeleted.Error()
	case errors.Is(err, ErrWrongHost):
		return http.StatusMisdirectedRequest, v4.CodeWrongHost, ErrWrongHost.Error()
	case errors.Is(err, ErrConflict):
		return http.StatusConflict, CodeConflict, err.Error()
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest, v4.CodeInvalidRequest, err.Error()
	case errors.Is(err, ErrRowLimit):
		var rl *RowLimitError
		if errors.As(err, &rl) {
			return http.StatusTooManyRequests, v4.CodeRowLimit, rl.Error()
		}
		return http.StatusTooManyRequests, v4.CodeRowLimit, ErrRowLimit.Error()
	case errors.Is(err, ErrBinding), errors.Is(err, ErrBindingRevoked):
		return http.StatusUnauthorized, v4.CodeUnauthorized, err.Error()
	case errors.Is(err, history.ErrStoreFailed):
		// A restore from the archive (a fork's, a recovery's init) met a
		// store outage: retryable, unlike damage (restoredamage.go).
		return http.StatusServiceUnavailable, v4.CodeUnavailable, "the archive store is unavailable, retry"
	case errors.Is(err, ErrRestoring):
		return http.StatusServiceUnavailable, v4.CodeUnavailable, ErrRestoring.Error()
	case isAccountBusy(err):
		return http.StatusTooManyRequests, v4.CodeRateLimited, err.Error()
	case errors.Is(err, errJobNotRewritten):
		// Retryable: the disk refused a job file's rewrite (importjobs.go).
		return http.StatusServiceUnavailable, v4.CodeUnavailable, errJobNotRewritten.Error()
	case errors.Is(err, ErrClosed), errors.Is(err, sqlexec.ErrClosed):
		return http.StatusServiceUnavailable, v4.CodeUnavailable, "object host unavailable, retry"
	default:
		return http.StatusInternalServerError, v4.CodeInternal, "internal error"
	}
}

// sqlStatus is the contract's HTTP status for each sqlexec code.
func sqlStatus(code int) int {
	switch code {
	case v4.CodeForbidden:
		return http.StatusForbidden
	case v4.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case v4.CodeOverloaded:
		return http.StatusTooManyRequests
	case v4.CodeRowLimit:
		return http.StatusTooManyRequests
	case v4.CodeInternal:
		return http.StatusInternalServerError
	case v4.CodeUnavailable:
		// e.g. durability = "archived" and the store did not confirm a
		// write: it is committed here, not acknowledged. A 4xx would tell
		// the client it was not carried out.
		return http.StatusServiceUnavailable
	default: // 7400, 7500, 7504, 7529
		return http.StatusBadRequest
	}
}

// RowLimitError is the refusal of a query of an account the limiter flagged
// (the limits feed, limitsfeed.go): it names the limit that was crossed and
// when the flag lifts. errors.Is(err, ErrRowLimit) holds.
type RowLimitError struct {
	Reason string    // the limit, e.g. "rows_written_per_day" (event.Limit.Reason)
	Until  time.Time // when the flag lifts
}

func (e *RowLimitError) Error() string {
	return "daily limit exceeded: the account has exceeded its " + limitName(e.Reason) +
		" limit, so its queries are refused until the limit lifts at " + e.Until.UTC().Format(time.RFC3339) +
		" (the daily limits reset at 00:00 UTC; upgrading the account lifts it sooner)"
}

func (e *RowLimitError) Is(target error) bool { return target == ErrRowLimit }

// limitName is a limit reason in words: "rows_read_per_day" → "rows read per
// day"; an empty reason is the daily rows limit in general.
func limitName(reason string) string {
	if reason == "" {
		return "daily rows"
	}
	return strings.ReplaceAll(reason, "_", " ")
}
