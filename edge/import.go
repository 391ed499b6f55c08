package edge

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"regexp"
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
		// The database must exist before we hand out an upload URL.
		if _, err := s.res.lookup(r.Context(), id); err != nil {
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
		var st json.RawMessage
		if err := s.hostCall(r.Context(), acct, id, http.MethodPost, "/import/ingest",
			map[string]string{"etag": etag, "filename": body.Filename}, &st); err != nil {
			s.writeErr(w, r, err)
			return
		}
		v4.WriteResult(w, st)
	case "poll":
		var st json.RawMessage
		if err := s.hostCall(r.Context(), acct, id, http.MethodPost, "/import/poll",
			map[string]string{"current_bookmark": body.CurrentBookmark}, &st); err != nil {
			s.writeErr(w, r, err)
			return
		}
		v4.WriteResult(w, st)
	default:
		s.writeErr(w, r, invalid(`Invalid property: action => must be "init", "ingest" or "poll"`))
	}
}

// handleImportUpload serves PUT /client/v4/shoal/upload/{token}: the body
// streams to the object host (never buffered here); the host computes its
// MD5, which ingest checks against the etag.
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
	s.passThrough(w, resp)
}
