package edge

// Export and import (D1's POST /{id}/export and /{id}/import). The edge keeps
// no state for either: the object host runs the jobs, and the two URLs a
// client is handed (the dump download and the import upload) are signed
// tokens the edge verifies itself, so any edge sharing the keyring serves
// them and they expire on their own.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// signedURLTTL is how long an export download or import upload URL works.
const signedURLTTL = time.Hour

// urlClaims are what a signed export/import URL grants.
type urlClaims struct {
	Kind     string   `json:"k"` // "export" | "import"
	Account  string   `json:"a"`
	Database string   `json:"d"`
	Filename string   `json:"f"`
	NoData   bool     `json:"nd,omitempty"`
	NoSchema bool     `json:"ns,omitempty"`
	Tables   []string `json:"t,omitempty"`
	Bookmark string   `json:"b,omitempty"` // export the database as of this time-travel bookmark
	Expires  int64    `json:"exp"`
}

var errBadURLToken = errors.New("invalid or expired signed URL")

// pollingBookmark is the at_bookmark this edge answers an export with when
// none was asked for (16 hex digits of the time): a client polling with it
// as current_bookmark means "the same export", not a time-travel point.
var pollingBookmark = regexp.MustCompile(`^[0-9a-f]{16}$`)

// urlKey derives the signed-URL key from the binding keyring's key material
// with HKDF (binding.Keyring.DeriveKey). Only holders of the binding key can compute it, every edge with the
// same keyring gets the same key, and the derived key is not itself a
// binding key, so a leaked download URL grants no query access. A key
// rotation invalidates outstanding URLs (they live an hour).
func (s *Server) urlKey() ([]byte, error) {
	if s.o.BindingKeys == nil {
		return nil, errURLsDisabled
	}
	return s.o.BindingKeys.DeriveKey("signed url v2"), nil
}

var errURLsDisabled = errors.New("export and import need a binding keyring on this edge")

func (s *Server) signURL(c urlClaims) (string, error) {
	key, err := s.urlKey()
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(body)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(p))
	return p + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

func (s *Server) verifyURL(tok, kind string) (urlClaims, error) {
	key, err := s.urlKey()
	if err != nil {
		return urlClaims{}, err
	}
	p, sig, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > 4096 {
		return urlClaims{}, errBadURLToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return urlClaims{}, errBadURLToken
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(p))
	if !hmac.Equal(got, m.Sum(nil)) {
		return urlClaims{}, errBadURLToken
	}
	body, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return urlClaims{}, errBadURLToken
	}
	var c urlClaims
	if err := json.Unmarshal(body, &c); err != nil || c.Kind != kind {
		return urlClaims{}, errBadURLToken
	}
	if s.o.Now().Unix() >= c.Expires {
		return urlClaims{}, errBadURLToken
	}
	return c, nil
}

// publicBase is the scheme and host the client reached us at.
func publicBase(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// writeDumpErr answers the export/import specific errors, else writeErr.
func (s *Server) writeDumpErr(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, errURLsDisabled):
		v4.WriteError(w, http.StatusNotImplemented, v4.CodeInvalidRequest, err.Error())
	case errors.Is(err, errBadURLToken):
		v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, err.Error())
	default:
		s.writeErr(w, r, err)
	}
}

// routeVia says where a per-database call may find its route when it is
// not cached: the catalog only, or — when the catalog is unavailable — the
// object hosts too (objectRoute; edge/DESIGN.md, "Which endpoints route
// through the object hosts").
type routeVia bool

const (
	viaCatalog routeVia = false
	viaHosts   routeVia = true
)

// route resolves id's route for acct as via allows.
func (s *Server) route(ctx context.Context, id, acct string, via routeVia) (Route, error) {
	if via == viaHosts {
		return s.objectRoute(ctx, id, acct)
	}
	return s.catalogRoute(ctx, id, acct)
}

// hostCall sends a JSON call about database id to its object host, with one
// retry through the catalog when the host says the route is stale (421, or
// 404/410 for the object) — the same rule as queries. via says whether the
// first route may come from the object hosts.
func (s *Server) hostCall(ctx context.Context, acct, id string, via routeVia, method, suffix string, body, out any) error {
	rt, err := s.route(ctx, id, acct, via)
	if err != nil {
		return err
	}
	err = s.hosts.call(ctx, rt.HostAddress, method, "/v1/objects/"+rt.ObjectID+suffix, &rt, body, out)
	var he *HostError
	if errors.As(err, &he) && (he.Status == http.StatusMisdirectedRequest || he.Status == http.StatusGone ||
		(he.Status == http.StatusNotFound && he.Code == v4.CodeNotFound)) {
		_ = s.cache.Invalidate(id, rt.Generation)
		rt, err = s.res.fill(ctx, id)
		if err == nil {
			err = usable(rt, acct)
		}
		if err != nil {
			return err
		}
		err = s.hosts.call(ctx, rt.HostAddress, method, "/v1/objects/"+rt.ObjectID+suffix, &rt, body, out)
		if errors.As(err, &he) && (he.Status == http.StatusGone || he.Status == http.StatusNotFound) {
			return ErrDatabaseNotFound
		}
	}
	if err != nil && !errors.As(err, &he) {
		return fmt.Errorf("%w: object host unreachable: %w", ErrUnavailable, err)
	}
	return err
}

type exportBody struct {
	OutputFormat    string `json:"output_format"`
	CurrentBookmark string `json:"current_bookmark,omitempty"`
	DumpOptions     *struct {
		NoData   bool     `json:"no_data"`
		NoSchema bool     `json:"no_schema"`
		Tables   []string `json:"tables"`
	} `json:"dump_options,omitempty"`
}

// ExportStatus is D1's export polling answer.
type ExportStatus struct {
	Success    bool          `json:"success"` // wrangler and cloudflare-go check it
	Type       string        `json:"type"`
	Status     string        `json:"status"`
	AtBookmark string        `json:"at_bookmark"`
	Messages   []string      `json:"messages"`
	Error      string        `json:"error,omitempty"`
	Result     *ExportResult `json:"result,omitempty"`
}

// ExportResult is where to download a finished export.
type ExportResult struct {
	Filename  string `json:"filename"`
	SignedURL string `json:"signed_url"`
}

// dumpRequest does what every export and import call starts with: signed
// URLs must be configured, the path names a database of the caller's
// account, the rate limits allow it, and the (small) JSON body decodes
// into dst (decodeD1: unknown fields ignored, known ones typed). It has answered the client when ok is false.
func (s *Server) dumpRequest(w http.ResponseWriter, r *http.Request, dst any) (acct, id string, ok bool) {
	if _, err := s.urlKey(); err != nil {
		s.writeDumpErr(w, r, err)
		return "", "", false
	}
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return "", "", false
	}
	if err := readD1JSON(r.Body, smallBodyBytes, dst); err != nil {
		s.writeErr(w, r, err)
		return "", "", false
	}
	return acct, id, true
}

// handleExport serves POST /{id}/export. Our export needs no preparation:
// the dump is streamed from a read snapshot of the database when the signed
// URL is fetched, so the first call already answers "complete" (a D1 client
// polling with current_bookmark gets the same answer again). at_bookmark is
// the instant the URL was issued; the snapshot is taken at download time.
func (s *Server) handleExport(w http.ResponseWriter, r *http.Request, _ principal) {
	var body exportBody
	acct, id, ok := s.dumpRequest(w, r, &body)
	if !ok {
		return
	}
	if body.OutputFormat != "polling" {
		s.writeErr(w, r, invalid(`Invalid property: output_format => must be "polling"`))
		return
	}
	c := urlClaims{Kind: "export", Account: acct, Database: id}
	if o := body.DumpOptions; o != nil {
		if o.NoData && o.NoSchema {
			s.writeErr(w, r, invalid("dump_options: no_data and no_schema exclude everything"))
			return
		}
		c.NoData, c.NoSchema, c.Tables = o.NoData, o.NoSchema, o.Tables
	}
	// Checks the database, the route and the tables now, so the client gets
	// errors from this call rather than from the download.
	start := map[string]any{"no_data": c.NoData, "no_schema": c.NoSchema, "tables": c.Tables}
	if body.CurrentBookmark != "" && !pollingBookmark.MatchString(body.CurrentBookmark) {
		// D1's "export at a bookmark": the host checks it (format,
		// retention) now and dumps the database as of it at download.
		rq := url.Values{}
		if err := s.timeTravelRetention(r, acct, rq, true); err != nil {
			s.writeErr(w, r, err)
			return
		}
		c.Bookmark = body.CurrentBookmark
		start["bookmark"], start["retention_days"] = c.Bookmark, rq.Get("retention_days")
	}
	if err := s.hostCall(r.Context(), acct, id, viaHosts, http.MethodPost, "/export", start, nil); err != nil {
		s.writeErr(w, r, err)
		return
	}
	now := s.o.Now()
	bookmark := body.CurrentBookmark
	if bookmark == "" {
		bookmark = fmt.Sprintf("%016x", now.UnixNano())
	}
	c.Filename = id + "-" + bookmark + ".sql"
	c.Expires = now.Add(signedURLTTL).Unix()
	tok, err := s.signURL(c)
	if err != nil {
		s.writeDumpErr(w, r, err)
		return
	}
	v4.WriteResult(w, ExportStatus{Success: true, Type: "export", Status: "complete", AtBookmark: bookmark,
		Messages: []string{"Export ready: the dump is read from a consistent snapshot when downloaded; the URL expires in 1 hour"},
		Result:   &ExportResult{Filename: c.Filename, SignedURL: publicBase(r) + "/client/v4/shoal/dump/" + tok}})
}

// handleExportDownload serves GET /client/v4/shoal/dump/{token}: the token is
// the credential. The dump streams from the object host through a fixed
// buffer; a failure mid-stream aborts the connection (the client sees a
// truncated transfer, never a short dump that looks complete).
func (s *Server) handleExportDownload(w http.ResponseWriter, r *http.Request) {
	c, err := s.verifyURL(mux.Vars(r)["token"], "export")
	if err != nil {
		s.writeDumpErr(w, r, err)
		return
	}
	if err := s.checkRate(c.Account, c.Database); err != nil {
		s.writeErr(w, r, err)
		return
	}
	q := url.Values{}
	if c.NoData {
		q.Set("no_data", "1")
	}
	if c.NoSchema {
		q.Set("no_schema", "1")
	}
	for _, t := range c.Tables {
		q.Add("table", t)
	}
	if c.Bookmark != "" {
		q.Set("bookmark", c.Bookmark)
	}
	resp, err := s.streamToHost(r.Context(), c, http.MethodGet, "/export/download?"+q.Encode(), nil, -1)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.passThrough(w, resp)
		return
	}
	w.Header().Set("Content-Type", "application/sql")
	w.Header().Set("Content-Disposition", `attachment; filename="`+c.Filename+`"`)
	w.WriteHeader(http.StatusOK)
	buf := s.copyBufs.Get().(*[]byte)
	_, err = io.CopyBuffer(w, resp.Body, *buf)
	s.copyBufs.Put(buf)
	if err != nil {
		// The host aborted (or the client left): abort our side too, so the
		// client sees a truncated transfer rather than a clean, short dump.
		panic(http.ErrAbortHandler)
	}
}

// streamToHost sends a streaming request to the claims' database on its
// object host (no timeout: dumps and uploads take as long as they take; the
// request context ends them). A stale route is retried once via the catalog
// only when there is no body (a streamed body cannot be replayed).
func (s *Server) streamToHost(ctx context.Context, c urlClaims, method, suffix string, body *http.Request, size int64) (*http.Response, error) {
	cl := &http.Client{Transport: s.hosts.http.Transport}
	for attempt := 0; ; attempt++ {
		var rt Route
		var err error
		if attempt == 0 {
			// The dump or upload only reaches the object: the hosts may
			// route it while the catalog is unavailable.
			rt, err = s.objectRoute(ctx, c.Database, c.Account)
		} else {
			rt, err = s.res.fill(ctx, c.Database)
			if err == nil {
				err = usable(rt, c.Account)
			}
		}
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, method, s.hosts.URL(rt.HostAddress, "/v1/objects/"+rt.ObjectID+suffix), nil)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.Body = body.Body
			req.ContentLength = size
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		setRouteHeaders(req.Header, rt)
		req.Header.Set(HeaderRequestID, requestIDFrom(ctx))
		resp, err := cl.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%w: object host unreachable: %w", ErrUnavailable, err)
		}
		switch resp.StatusCode {
		case http.StatusMisdirectedRequest, http.StatusGone, http.StatusNotFound:
			resp.Body.Close()
			_ = s.cache.Invalidate(c.Database, rt.Generation)
			if attempt == 0 && body == nil {
				continue
			}
			if resp.StatusCode == http.StatusMisdirectedRequest {
				return nil, fmt.Errorf("%w: database route is changing", ErrUnavailable)
			}
			return nil, ErrDatabaseNotFound
		}
		return resp, nil
	}
}

// parseSize reads a Content-Length header value (-1 when unknown).
func parseSize(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return -1
	}
	return n
}
