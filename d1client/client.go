// Package d1client is a client of Shoal's public, D1-compatible HTTP API
// (/client/v4/accounts/{account}/d1/database/…). It speaks only that API, so
// it works against any Shoal edge (and, for the D1 subset, against D1).
//
// A Client is safe for concurrent use.
package d1client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Client calls one account's D1 API.
type Client struct {
	BaseURL   string // e.g. http://127.0.0.1:8787 (no trailing /client/v4)
	Token     string // API token (Authorization: Bearer)
	AccountID string
	HTTP      *http.Client // default: no overall timeout (dumps stream)
	// PollInterval is the pause between export/import status polls; default 500ms.
	PollInterval time.Duration
}

// APIError is a failed v4 envelope.
type APIError struct {
	Status  int
	Code    int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s [%d]", e.Message, e.Code)
}

// Sentinels matched by errors.Is against an *APIError's class.
var (
	ErrNotFound    = errors.New("not found")
	ErrAuth        = errors.New("authentication failed")
	ErrUnavailable = errors.New("service unavailable")
)

// Is classifies API errors: 404/7404 → ErrNotFound, 401/403 → ErrAuth,
// 429/5xx → ErrUnavailable (retryable).
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Status == http.StatusNotFound || e.Code == 7404
	case ErrAuth:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	case ErrUnavailable:
		return e.Status == http.StatusTooManyRequests || e.Status >= 500
	}
	return false
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) dbURL(parts ...string) string {
	u := strings.TrimRight(c.BaseURL, "/") + "/client/v4/accounts/" + url.PathEscape(c.AccountID) + "/d1/database"
	for _, p := range parts {
		u += "/" + url.PathEscape(p)
	}
	return u
}

type envelope struct {
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	ResultInfo *ResultInfo `json:"result_info,omitempty"`
}

// ResultInfo is the pagination block of list answers.
type ResultInfo struct {
	Page       int   `json:"page"`
	PerPage    int   `json:"per_page"`
	Count      int   `json:"count"`
	TotalCount int64 `json:"total_count"`
}

// do sends a JSON request and decodes the envelope's result into out (when
// non-nil); raw, when non-nil, receives the result bytes untouched.
func (c *Client) do(ctx context.Context, method, u string, body any, out any, raw *json.RawMessage) (*ResultInfo, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, &APIError{Status: http.StatusServiceUnavailable, Code: 7503, Message: "cannot reach " + c.BaseURL + ": " + shortNetErr(err)}
	}
	defer resp.Body.Close()
	return decode(resp, out, raw)
}

// Call sends a JSON request to any v4 endpoint under BaseURL (path from
// the root, e.g. "/admin/v1/accounts") and decodes the envelope's result
// into out; a failed envelope is an *APIError.
func (c *Client) Call(ctx context.Context, method, path string, body, out any) error {
	_, err := c.do(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, body, out, nil)
	return err
}

func shortNetErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

func decode(resp *http.Response, out any, raw *json.RawMessage) (*ResultInfo, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, &APIError{Status: http.StatusServiceUnavailable, Code: 7503, Message: "reading the answer: " + err.Error()}
	}
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, &APIError{Status: resp.StatusCode, Code: 7000, Message: fmt.Sprintf("unexpected answer (HTTP %d): %.200s", resp.StatusCode, b)}
	}
	if !env.Success || resp.StatusCode >= 300 {
		e := &APIError{Status: resp.StatusCode, Code: 7000, Message: http.StatusText(resp.StatusCode)}
		if len(env.Errors) > 0 {
			e.Code, e.Message = env.Errors[0].Code, env.Errors[0].Message
		}
		return nil, e
	}
	if raw != nil {
		*raw = env.Result
	}
	if out != nil {
		// UseNumber: integers up to 2^63-1 survive (float64 would round them).
		dec := json.NewDecoder(bytes.NewReader(env.Result))
		dec.UseNumber()
		if err := dec.Decode(out); err != nil {
			return nil, fmt.Errorf("decode result: %w", err)
		}
	}
	return env.ResultInfo, nil
}

// Database is D1's database object.
type Database struct {
	UUID            string  `json:"uuid"`
	Name            string  `json:"name"`
	CreatedAt       string  `json:"created_at"`
	Version         string  `json:"version"`
	NumTables       int64   `json:"num_tables"`
	FileSize        int64   `json:"file_size"`
	Jurisdiction    *string `json:"jurisdiction"`
	RunningInRegion string  `json:"running_in_region,omitempty"`
}

// CreateOptions are create's optional fields.
type CreateOptions struct {
	PrimaryLocationHint string `json:"primary_location_hint,omitempty"`
	Jurisdiction        string `json:"jurisdiction,omitempty"`
}

// Create creates a database; raw receives the API's result.
func (c *Client) Create(ctx context.Context, name string, o CreateOptions, raw *json.RawMessage) (Database, error) {
	var d Database
	body := map[string]string{"name": name}
	if o.PrimaryLocationHint != "" {
		body["primary_location_hint"] = o.PrimaryLocationHint
	}
	if o.Jurisdiction != "" {
		body["jurisdiction"] = o.Jurisdiction
	}
	_, err := c.do(ctx, http.MethodPost, c.dbURL(), body, &d, raw)
	return d, err
}

// List returns every database (all pages), filtered by exact name when
// name is not empty; raw receives the first page's result.
func (c *Client) List(ctx context.Context, name string, raw *json.RawMessage) ([]Database, error) {
	var all []Database
	for page := 1; ; page++ {
		q := url.Values{"page": {fmt.Sprint(page)}, "per_page": {"1000"}}
		if name != "" {
			q.Set("name", name)
		}
		var dbs []Database
		var r *json.RawMessage
		if page == 1 {
			r = raw
		}
		info, err := c.do(ctx, http.MethodGet, c.dbURL()+"?"+q.Encode(), nil, &dbs, r)
		if err != nil {
			return nil, err
		}
		all = append(all, dbs...)
		if info == nil || len(dbs) == 0 || int64(len(all)) >= info.TotalCount || page >= 1000 {
			return all, nil
		}
	}
}

// Get returns a database by UUID.
func (c *Client) Get(ctx context.Context, uuid string, raw *json.RawMessage) (Database, error) {
	var d Database
	_, err := c.do(ctx, http.MethodGet, c.dbURL(uuid), nil, &d, raw)
	return d, err
}

// Delete deletes a database by UUID.
func (c *Client) Delete(ctx context.Context, uuid string) error {
	_, err := c.do(ctx, http.MethodDelete, c.dbURL(uuid), nil, nil, nil)
	return err
}

// Resolve turns a database name or UUID into its UUID (names through the
// list API's name filter). Unknown → *APIError with code 7404.
func (c *Client) Resolve(ctx context.Context, nameOrUUID string) (string, error) {
	if isUUID(nameOrUUID) {
		return strings.ToLower(nameOrUUID), nil
	}
	dbs, err := c.List(ctx, nameOrUUID, nil)
	if err != nil {
		return "", err
	}
	for _, d := range dbs {
		if d.Name == nameOrUUID {
			return d.UUID, nil
		}
	}
	return "", &APIError{Status: http.StatusNotFound, Code: 7404, Message: fmt.Sprintf("database %q not found", nameOrUUID)}
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// QueryResult is one statement's result of /query.
type QueryResult struct {
	Results []map[string]any `json:"results"`
	Success bool             `json:"success"`
	Meta    map[string]any   `json:"meta"`
}

// RawResult is one statement's result of /raw: columns in order.
type RawResult struct {
	Results struct {
		Columns []string `json:"columns"`
		Rows    [][]any  `json:"rows"`
	} `json:"results"`
	Success bool           `json:"success"`
	Meta    map[string]any `json:"meta"`
}

// Raw runs SQL (possibly several statements) through /raw, which keeps
// column order; raw receives the API's result.
func (c *Client) Raw(ctx context.Context, uuid, sql string, raw *json.RawMessage) ([]RawResult, error) {
	if err := checkSQLText(sql); err != nil {
		return nil, err
	}
	var out []RawResult
	_, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "raw"), map[string]any{"sql": sql}, &out, raw)
	return out, err
}

// Query runs SQL through /query; raw receives the API's result.
func (c *Client) Query(ctx context.Context, uuid, sql string, raw *json.RawMessage) ([]QueryResult, error) {
	if err := checkSQLText(sql); err != nil {
		return nil, err
	}
	var out []QueryResult
	_, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "query"), map[string]any{"sql": sql}, &out, raw)
	return out, err
}

// ErrInvalidText is returned for SQL that cannot be sent exactly: JSON
// encoding would replace invalid UTF-8 with U+FFFD, silently changing it.
var ErrInvalidText = errors.New("SQL is not valid UTF-8")

// checkSQLText refuses SQL json.Marshal would change (invalid UTF-8, say a
// Latin-1 file) before anything is sent; the server refuses NUL itself.
func checkSQLText(sql string) error {
	if utf8.ValidString(sql) {
		return nil
	}
	for i := 0; i < len(sql); {
		r, n := utf8.DecodeRuneInString(sql[i:])
		if r == utf8.RuneError && n == 1 {
			return fmt.Errorf("%w: byte offset %d (convert the file to UTF-8)", ErrInvalidText, i)
		}
		i += n
	}
	return ErrInvalidText
}

// Binding is a minted binding token.
type Binding struct {
	Token        string `json:"token"`
	TokenID      string `json:"token_id"` // what RevokeBinding takes
	DatabaseUUID string `json:"database_uuid"`
	ExpiresAt    string `json:"expires_at"`
}

// BindingRevocation is the edge's answer to a revocation.
type BindingRevocation struct {
	DatabaseUUID string `json:"database_uuid"`
	TokenID      string `json:"token_id,omitempty"` // the one token revoked
	All          bool   `json:"all"`                // every token minted so far
}

// RevokeBinding revokes one binding token of the database, by the token_id
// its mint answered (DELETE …/binding/{token_id}); tokenID "" revokes
// every token minted for it so far (DELETE …/binding). Either takes effect
// on the database's object host before the call returns.
func (c *Client) RevokeBinding(ctx context.Context, uuid, tokenID string, raw *json.RawMessage) (BindingRevocation, error) {
	var r BindingRevocation
	path := "binding"
	if tokenID != "" {
		path += "/" + url.PathEscape(tokenID)
	}
	_, err := c.do(ctx, http.MethodDelete, c.dbURL(uuid, path), nil, &r, raw)
	return r, err
}

// CreateBinding mints a binding token (ttlSeconds 0 = the edge's default).
func (c *Client) CreateBinding(ctx context.Context, uuid string, ttlSeconds int64, raw *json.RawMessage) (Binding, error) {
	var b Binding
	var body any
	if ttlSeconds > 0 {
		body = map[string]int64{"ttl_seconds": ttlSeconds}
	}
	_, err := c.do(ctx, http.MethodPost, c.dbURL(uuid, "binding"), body, &b, raw)
	return b, err
}
