package edge

import (
	"context"
	"net/http"
	"net/url"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// D1's Time Travel (docs/api.md, "Time travel"), served by the database's
// object host from its change log (objecthost/history):
//
//   - GET …/{database_id}/time_travel/bookmark[?timestamp=T]: the current
//     bookmark, or the one for the database as of T (RFC 3339 or Unix
//     seconds);
//   - POST …/{database_id}/time_travel/restore?bookmark=B | ?timestamp=T:
//     restore the database to that point; the answer's previous_bookmark
//     undoes it (a restore is a new point of the history, nothing older is
//     dropped).
//
// Retention follows the account's tier as on D1: 7 days on the free tier,
// 30 on paid ones. The host enforces it, the restore rate limit (10 per
// 10 minutes per database) and the validation of bookmarks and times; its
// D1-style refusals are passed through, among them a host without history
// (400, "time travel is not enabled").

// bookmarkJSON is GET …/time_travel/bookmark's result.
type bookmarkJSON struct {
	Bookmark string `json:"bookmark"`
}

// restoreJSON is POST …/time_travel/restore's result.
type restoreJSON struct {
	Bookmark         string `json:"bookmark"`
	PreviousBookmark string `json:"previous_bookmark"`
	Message          string `json:"message"`
}

func (s *Server) handleTimeTravelBookmark(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out, err := s.bookmarkAt(r, acct, id, r.URL.Query().Get("timestamp"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v4.WriteResult(w, out)
}

// bookmarkAt asks the database's host for its bookmark now, or at
// timestamp (within the account tier's retention); the host archives what
// the bookmark names.
func (s *Server) bookmarkAt(r *http.Request, acct, id, timestamp string) (bookmarkJSON, error) {
	q := url.Values{}
	if timestamp != "" {
		q.Set("timestamp", timestamp)
	}
	var out bookmarkJSON
	if timestamp != "" {
		// Only a past point needs the tier's retention; the current
		// bookmark needs no catalog read at all.
		if err := s.timeTravelRetention(r, acct, q, true); err != nil {
			return out, err
		}
	}
	// A read: the object hosts may route it while the catalog is
	// unavailable.
	err := s.hostCall(r.Context(), acct, id, viaHosts, http.MethodGet, "/time_travel/bookmark?"+q.Encode(), nil, &out)
	return out, err
}

func (s *Server) handleTimeTravelRestore(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	in := r.URL.Query()
	bm, ts := in.Get("bookmark"), in.Get("timestamp")
	if (bm == "") == (ts == "") {
		s.writeErr(w, r, invalid("restore needs exactly one of bookmark or timestamp"))
		return
	}
	q := url.Values{}
	if bm != "" {
		q.Set("bookmark", bm)
	} else {
		q.Set("timestamp", ts)
	}
	if err := s.timeTravelRetention(r, acct, q, false); err != nil {
		s.writeErr(w, r, err)
		return
	}
	var out restoreJSON
	if err := s.hostCall(r.Context(), acct, id, viaCatalog, http.MethodPost, "/time_travel/restore?"+q.Encode(), nil, &out); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.recordAudit(r.Context(), fsm.RecordAudit{Action: "time_travel_restore", AccountID: acct, Subject: id,
		Detail: map[string]string{"bookmark": out.Bookmark, "previous_bookmark": out.PreviousBookmark}})
	v4.WriteResult(w, out)
}

// auditRecorder is the optional part of Catalog that records actions done
// outside the catalog (fsm.CmdRecordAudit); RaftmetaCatalog has it.
type auditRecorder interface {
	RecordAudit(ctx context.Context, a fsm.RecordAudit) error
}

// recordAudit records a in the audit log in the background (best effort:
// the action is done), with who and from where from ctx.
func (s *Server) recordAudit(ctx context.Context, a fsm.RecordAudit) {
	ar, ok := s.catalog.(auditRecorder)
	if !ok {
		return
	}
	who, _ := fsm.AuditFrom(ctx)
	s.goBackground("audit", func(bg context.Context) error {
		return ar.RecordAudit(fsm.WithAudit(bg, who), a)
	})
}

// timeTravelRetention adds the account tier's retention (D1: 7 days free,
// 30 paid) to the host call. For a read of history (bookmarks, exports at
// a point), read is true and the tier may be a stale one while the catalog
// is unavailable (staleAccountRow); a restore rewrites the database and
// takes only a fresh one.
func (s *Server) timeTravelRetention(r *http.Request, acct string, q url.Values, read bool) error {
	get := s.accountRow
	if read {
		get = s.staleAccountRow
	}
	a, err := get(r.Context(), acct)
	if err != nil {
		return err
	}
	days := "30"
	if a.Tier == fsm.TierFree {
		days = "7"
	}
	q.Set("retention_days", days)
	return nil
}
