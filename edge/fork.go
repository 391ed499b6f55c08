package edge

import (
	"context"
	"net/http"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Forks (beyond D1): POST …/d1/database/{database_id}/fork creates a new
// database of the same account whose content is the source as of a
// bookmark (or a timestamp, or now), read from the source's off-host
// archive (objecthost/history). It is the create flow (databases.go) with
// one difference at step (4): the new object's init restores the archived
// state before it answers, so the catalog write — the checkpoint — only
// ever names an object that holds the fork's content. The source is never
// blocked: the edge asks its host for a bookmark (which archives the
// source's last commits if needed), and the new host downloads the newest
// snapshot at or before the bookmark plus the segments after it, nothing
// else. The fork's own history starts with a full snapshot (its base), so
// it never depends on the source's archive, which retention may sweep.
//
// The fork stays in the source's jurisdiction (a legal constraint); a
// location hint applies to a source without one.

// forkBody is the fork's body: name (required), at most one of bookmark
// and timestamp (RFC 3339 or Unix seconds; neither: the source's latest
// commit), primary_location_hint. Unknown fields are ignored, as on every
// D1 body.
type forkBody struct {
	Name                *string `json:"name"`
	Bookmark            *string `json:"bookmark,omitempty"`
	Timestamp           *string `json:"timestamp,omitempty"`
	PrimaryLocationHint *string `json:"primary_location_hint,omitempty"`
}

// forkJSON is the fork's answer: the new database's object, as create
// answers it, and what it was forked from.
type forkJSON struct {
	databaseJSON
	ForkedFrom forkSourceJSON `json:"forked_from"`
}

type forkSourceJSON struct {
	UUID     string `json:"uuid"`
	Bookmark string `json:"bookmark"`
}

// maxBookmarkBytes bounds a bookmark given in a body or query (D1's are
// 91 bytes; ours, objecthost/history/bookmark.go, 91 too).
const maxBookmarkBytes = 128

func parseForkBody(b []byte, l Limits) (forkBody, error) {
	var f forkBody
	if err := decodeD1(b, &f); err != nil {
		return f, err
	}
	if f.Name == nil {
		return f, invalid("Invalid property: name => required (the new database's name)")
	}
	if err := checkName(*f.Name, l); err != nil {
		return f, err
	}
	if f.Bookmark != nil && f.Timestamp != nil {
		return f, invalid("Invalid property: give at most one of bookmark and timestamp")
	}
	if f.Bookmark != nil {
		bm := *f.Bookmark
		if bm == "" || len(bm) > maxBookmarkBytes {
			return f, invalid("Invalid property: bookmark => must be a bookmark from time_travel/bookmark")
		}
		for i := 0; i < len(bm); i++ {
			if c := bm[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
				return f, invalid("Invalid property: bookmark => must be a bookmark from time_travel/bookmark")
			}
		}
	}
	if f.Timestamp != nil && (*f.Timestamp == "" || len(*f.Timestamp) > 64) {
		return f, invalid("Invalid property: timestamp => RFC 3339 or Unix seconds")
	}
	if f.PrimaryLocationHint != nil && *f.PrimaryLocationHint != "" {
		if err := checkLocationHint(*f.PrimaryLocationHint); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (s *Server) handleFork(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.checkRate(acct, ""); err != nil {
		s.writeErr(w, r, err)
		return
	}
	b, err := readBody(r.Body, s.o.Limits.MaxBodyBytes)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body, err := parseForkBody(b, s.o.Limits)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	src, err := s.ownDatabase(r.Context(), acct, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The bookmark: given, or the source host's for the timestamp or now
	// (it checks the tier's retention and archives what it names).
	bookmark := ""
	if body.Bookmark != nil {
		bookmark = *body.Bookmark
	} else {
		ts := ""
		if body.Timestamp != nil {
			ts = *body.Timestamp
		}
		out, err := s.bookmarkAt(r, acct, id, ts)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		bookmark = out.Bookmark
	}
	cb := CreateBody{Name: body.Name, PrimaryLocationHint: body.PrimaryLocationHint}
	if src.Jurisdiction != "" {
		j := src.Jurisdiction
		cb.Jurisdiction = &j
	}
	// As create: run to completion even if the client leaves. A restore
	// downloads up to about twice the database, hence the longer bound.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Minute)
	defer cancel()
	d, err := s.createDatabase(ctx, acct, cb, &RestoreSource{DatabaseUUID: id, Bookmark: bookmark})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.writes.wrote(acct)
	s.log.Info("database forked", "request_id", requestIDFrom(r.Context()), "account", acct, "source", id, "bookmark", bookmark, "fork", d.UUID)
	out := forkJSON{databaseJSON: s.liveJSON(ctx, d), ForkedFrom: forkSourceJSON{UUID: id, Bookmark: bookmark}}
	out.CreatedInRegion = out.RunningInRegion
	v4.WriteResult(w, out)
}
