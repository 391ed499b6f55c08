package edge

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// maxImportBytes is D1's import size limit (the host enforces it too).
const maxImportBytes = 5 << 30

var etagRe = regexp.MustCompile(`^[0-9a-fA-F]{32}$`)

type importBody struct {
	Action          string `json:"action"`
	Etag            string `json:"etag,omitempty"`
	Filename        string `json:"filename,omitempty"`
	CurrentBookmark string `json:"current_bookmark,omitempty"`
}

// ImportInit is the answer to {action:"init"}.
type ImportInit struct {
	UploadURL string `json:"upload_url"`
	Filename  string `json:"filename"`
}

// ImportStatus is D1's import polling answer as the client sees it. The
// object host keeps one job per database and reports every message of it
// on each poll, with the job's file name as its bookmark; the edge keeps no
// state, so it puts the number of messages a client has already been given
// in the bookmark it hands out ("<file>:<n>") and answers each poll with the
// new ones only (wrangler prints every message it receives). errors holds
// the failure as wrangler reads it (a list of strings, joined for display);
// error is the same text, kept for older Shoal clients.
type ImportStatus struct {
	Success    bool            `json:"success"`
	Type       string          `json:"type"`
	Status     string          `json:"status"`
	AtBookmark string          `json:"at_bookmark"`
	Messages   []string        `json:"messages"`
	Errors     []string        `json:"errors"`
	Error      string          `json:"error,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Progress   json.RawMessage `json:"progress,omitempty"`
}

// forClient turns the host's status into the answer to a client that has
// seen the first seen messages of the job.
func (st ImportStatus) forClient(seen int) ImportStatus {
	all := st.Messages
	if seen > len(all) || seen < 0 {
		seen = len(all) // a bookmark from a previous job of the same file
	}
	st.Messages = append([]string{}, all[seen:]...)
	st.AtBookmark = st.AtBookmark + ":" + strconv.Itoa(len(all))
	st.Errors = []string{}
	if st.Error != "" {
		st.Errors = append(st.Errors, st.Error)
	}
	st.Success = true // the poll succeeded; status says how the job is doing
	return st
}

// splitImportBookmark reads a bookmark made by forClient; a bare job name
// (what the host and older edges hand out) means nothing seen yet.
func splitImportBookmark(b string) (job string, seen int) {
	if i := strings.LastIndexByte(b, ':'); i >= 0 {
		if n, err := strconv.Atoi(b[i+1:]); err == nil && n >= 0 {
			return b[:i], n
		}
	}
	return b, 0
}

// handleImport serves POST /{id}/import: init (sign an upload URL), ingest
// (the host verifies the file's MD5 against etag and starts the job) and
// poll (the job's status, passed through from the host).
func (s *Server) handleImport(w http.ResponseWriter, r *http.Request, _ principal) {
	var body importBody
	acct, id, ok := s.dumpRequest(w, r, &body)
	if !ok {
		return
	}
	etag := strings.Trim(body.Etag, `"`)
	switch body.Action {
	case "init":
		if !etagRe.MatchString(etag) {
			s.writeErr(w, r, invalid("Invalid property: etag => must be the MD5 hex digest of the file"))
			return
		}
		// The database must exist, and be this account's, before we hand
		// out an upload URL: another account's database is "not found"
		// here as everywhere (no existence oracle). The object hosts may
		// answer while the catalog is unavailable (objectRoute: never a
		// 404 on their partial view).
		if _, err := s.objectRoute(r.Context(), id, acct); err != nil {
			s.writeErr(w, r, err)
			return
		}
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		name := strings.ToLower(etag) + "-" + hex.EncodeToString(rnd[:]) + ".sql"
		tok, err := s.signURL(urlClaims{Kind: "import", Account: acct, Database: id, Filename: name,
			Expires: s.o.Now().Add(signedURLTTL).Unix()})
		if err != nil {
			s.writeDumpErr(w, r, err)
			return
		}
		v4.WriteResult(w, ImportInit{UploadURL: publicBase(r) + "/client/v4/shoal/upload/" + tok, Filename: name})
	case "ingest":
		if !etagRe.MatchString(etag) || body.Filename == "" {
			s.writeErr(w, r, invalid("Invalid request: ingest needs etag and filename"))
			return
		}
		var st ImportStatus
		if err := s.hostCall(r.Context(), acct, id, viaHosts, http.MethodPost, "/import/ingest",
			map[string]string{"etag": etag, "filename": body.Filename}, &st); err != nil {
			s.writeErr(w, r, err)
			return
		}
		v4.WriteResult(w, st.forClient(0))
	case "poll":
		job, seen := splitImportBookmark(body.CurrentBookmark)
		var st ImportStatus
		if err := s.hostCall(r.Context(), acct, id, viaHosts, http.MethodPost, "/import/poll",
			map[string]string{"current_bookmark": job}, &st); err != nil {
			s.writeErr(w, r, err)
			return
		}
		v4.WriteResult(w, st.forClient(seen))
	default:
		s.writeErr(w, r, invalid(`Invalid property: action => must be "init", "ingest" or "poll"`))
	}
}

// handleImportUpload serves PUT /client/v4/shoal/upload/{token}: the body
// streams to the object host (never buffered here); the host computes its
// MD5, which ingest checks against the etag. Like R2's PUT, the answer
// carries that MD5 as a quoted hex ETag header: wrangler compares it with
// the file's MD5 before it asks for the ingest.
func (s *Server) handleImportUpload(w http.ResponseWriter, r *http.Request) {
	c, err := s.verifyURL(mux.Vars(r)["token"], "import")
	if err != nil {
		s.writeDumpErr(w, r, err)
		return
	}
	if err := s.checkRate(c.Account, c.Database); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if r.ContentLength > maxImportBytes {
		v4.WriteError(w, http.StatusRequestEntityTooLarge, v4.CodeTooLarge, "import file over 5 GB")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxImportBytes)
	resp, err := s.streamToHost(r.Context(), c, http.MethodPut, "/import/upload/"+c.Filename, r, parseSize(r.Header.Get("Content-Length")))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.passThrough(w, resp)
		return
	}
	// The host's answer is a small v4 envelope with the upload's MD5.
	b, err := io.ReadAll(io.LimitReader(resp.Body, smallBodyBytes))
	if err != nil {
		s.writeErr(w, r, fmt.Errorf("%w: object host upload answer: %w", ErrUnavailable, err))
		return
	}
	var env struct {
		Result struct {
			Etag string `json:"etag"`
		} `json:"result"`
	}
	if json.Unmarshal(b, &env) == nil && etagRe.MatchString(env.Result.Etag) {
		w.Header().Set("ETag", `"`+strings.ToLower(env.Result.Etag)+`"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
