package traffic

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The export, import and insights endpoints (D1's POST …/export and
// …/import, Shoal's GET …/insights). Each is recorded as one operation
// spanning every request of its flow; what the checks need to judge the
// answers (the dump's rows, whether an error was D1-style) is kept in the
// operation (Op.Values, Op.Malformed).

// dumpHeader is the first line of every export (D1's, objecthost/dump).
const dumpHeader = "PRAGMA defer_foreign_keys=TRUE;"

// exportRowPrefix is how an export writes a row of table t (one integer
// column v): INSERT INTO "t"("v") VALUES(123);
const exportRowPrefix = `INSERT INTO "t"("v") VALUES(`

// pollEvery paces export and import polls; pollFor bounds an import's
// polling (a job of a few rows takes milliseconds; past this its outcome
// is unknown).
const (
	pollEvery = 100 * time.Millisecond
	pollFor   = 20 * time.Second
)

// notD1 says why an HTTP answer is not D1-style: a success in the v4
// envelope, or an error in it (success false, errors[0] with a code and a
// message). "" when it is, or when there was no HTTP answer (a transport
// error, a body cut short: the client sees the failure for what it is).
func (a answer) notD1() string {
	switch {
	case a.status == 0:
		return ""
	case a.badBody:
		return fmt.Sprintf("status %d without the v4 envelope: %s", a.status, clip(a.raw))
	case a.err != nil:
		return ""
	case a.status >= 200 && a.status < 300 && a.Success:
		return ""
	case a.status >= 200 && a.status < 300:
		return fmt.Sprintf("status %d with success false: %s", a.status, clip(a.raw))
	case a.Success:
		return fmt.Sprintf("status %d with success true: %s", a.status, clip(a.raw))
	case len(a.Errors) == 0 || a.Errors[0].Code == 0 || a.Errors[0].Message == "":
		return fmt.Sprintf("status %d: an error without a code and a message: %s", a.status, clip(a.raw))
	}
	return ""
}

// clip is b as text, at most 300 bytes of it.
func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// countSent adds one to db's requests that may bill a usage event (an
// import's ingest bills one: Client.Sent's upper bound stays one).
func (c *Client) countSent(db string) {
	c.sentMu.Lock()
	defer c.sentMu.Unlock()
	if c.sent == nil {
		c.sent = map[string]int{}
	}
	c.sent[db]++
}

// rawCall sends a request whose answer may not be JSON (a dump download,
// an upload) and returns the answer as it came. auth "" sends none (signed
// URLs are their own credential).
func (c *Client) rawCall(ctx context.Context, method, url string, body []byte) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw, err
}

// envelopeOf reads a non-2xx raw answer as the v4 envelope.
func envelopeOf(status int, raw []byte) answer {
	a := answer{status: status, raw: raw}
	if err := json.Unmarshal(raw, &a); err != nil {
		a.err = fmt.Errorf("status %d, not a v4 envelope: %s", status, clip(raw))
		a.badBody = true
	}
	return a
}

// Export exports db through edge as a D1 client does: POST …/export
// (output_format "polling", polling with the answer's at_bookmark until
// it is complete), then a GET of the signed URL. Op.Values are the rows
// of table t in the dump.
func (c *Client) Export(ctx context.Context, client, edge int, db string) Op {
	op := Op{Client: client, Kind: Export, DB: db, Call: c.h.Now()}
	done := func(o Outcome, answer, malformed string) Op {
		op.Outcome, op.Answer, op.Malformed, op.Return = o, answer, malformed, c.h.Now()
		return c.h.Add(op)
	}
	body := map[string]any{"output_format": "polling"}
	var signed string
	for polls := 0; ; polls++ {
		a := c.do(ctx, edge, http.MethodPost, "/"+db+"/export", body)
		if a.outcome() != OK {
			return done(a.outcome(), "export: "+a.text(), a.notD1())
		}
		var st struct {
			Status     string `json:"status"`
			AtBookmark string `json:"at_bookmark"`
			Error      string `json:"error"`
			Result     *struct {
				SignedURL string `json:"signed_url"`
			} `json:"result"`
		}
		if err := json.Unmarshal(a.Result, &st); err != nil {
			return done(Unknown, "export: "+a.text(), "200 whose result is not an export status")
		}
		if st.Status == "complete" && st.Result != nil && st.Result.SignedURL != "" {
			signed = st.Result.SignedURL
			break
		}
		if st.Status == "error" {
			mal := ""
			if st.Error == "" {
				mal = "export status error without an error message"
			}
			return done(Refused, "export error: "+a.text(), mal)
		}
		if polls >= int(pollFor/pollEvery) {
			return done(Unknown, "export never complete: "+a.text(), "")
		}
		body["current_bookmark"] = st.AtBookmark
		time.Sleep(pollEvery) // D1's polling protocol: ask again until complete
	}
	op.From = c.h.Now()
	status, _, raw, err := c.rawCall(ctx, http.MethodGet, signed, nil)
	switch {
	case status == 0:
		return done(Unknown, "download: "+err.Error(), "")
	case status != http.StatusOK:
		a := envelopeOf(status, raw)
		return done(a.outcome(), "download: "+a.text(), a.notD1())
	case err != nil:
		// The transfer was cut short: the edge aborts the connection when
		// the host fails mid-dump (never a clean, short dump).
		return done(Unknown, fmt.Sprintf("download aborted after %d bytes: %v", len(raw), err), "")
	}
	vals, bad := parseDump(raw)
	op.Values = vals
	return done(OK, fmt.Sprintf("200, %d bytes, %d rows of t", len(raw), len(vals)), bad)
}

// parseDump reads the values of table t from an export, and says what is
// wrong with it if it is not a whole dump: D1's header first, every line
// a complete statement (a comment aside), a newline at the end, every row
// of t an integer.
func parseDump(raw []byte) ([]int64, string) {
	s := string(raw)
	if !strings.HasPrefix(s, dumpHeader+"\n") {
		return nil, fmt.Sprintf("200 dump of %d bytes that does not start with %q", len(raw), dumpHeader)
	}
	if !strings.HasSuffix(s, "\n") {
		return nil, fmt.Sprintf("200 dump of %d bytes cut short (no final newline): …%s", len(raw), clip([]byte(s[max(0, len(s)-80):])))
	}
	var vals []int64
	for i, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "-- "):
		case !strings.HasSuffix(line, ";"):
			return vals, fmt.Sprintf("200 dump whose line %d is not a complete statement: %s", i+1, clip([]byte(line)))
		case strings.HasPrefix(line, `INSERT INTO "t"`):
			num, ok := strings.CutPrefix(line, exportRowPrefix)
			if ok {
				num, ok = strings.CutSuffix(num, ");")
			}
			v, err := strconv.ParseInt(num, 10, 64)
			if !ok || err != nil {
				return vals, fmt.Sprintf("200 dump whose line %d is not a row of t: %s", i+1, clip([]byte(line)))
			}
			vals = append(vals, v)
		}
	}
	return vals, ""
}

// importDump is the file an import sends: table imp and one row per value.
func importDump(values []int64) []byte {
	var b strings.Builder
	b.WriteString("CREATE TABLE imp (v INTEGER PRIMARY KEY);\n")
	for _, v := range values {
		fmt.Fprintf(&b, "INSERT INTO imp (v) VALUES (%d);\n", v)
	}
	return []byte(b.String())
}

// Import imports a dump creating table imp with values into db, as a D1
// client does: init (the file's MD5 as etag) → PUT the file to the upload
// URL → ingest → poll until complete or error. edge picks the edge of
// each step (init and upload go to one edge: the upload URL names it;
// ingest and polls may go to any).
func (c *Client) Import(ctx context.Context, client int, edge func() int, db string, values []int64) Op {
	op := Op{Client: client, Kind: Import, DB: db, Values: values, Call: c.h.Now()}
	done := func(o Outcome, answer, malformed string) Op {
		op.Outcome, op.Answer, op.Return = o, answer, c.h.Now()
		if op.Malformed == "" {
			op.Malformed = malformed
		}
		return c.h.Add(op)
	}
	// Before the ingest nothing can import: a step without a definite
	// answer there is Failed (not carried out), not Unknown.
	before := func(o Outcome) Outcome {
		if o == Unknown {
			return Failed
		}
		return o
	}
	file := importDump(values)
	sum := md5.Sum(file)
	etag := hex.EncodeToString(sum[:])
	e := edge()
	a := c.do(ctx, e, http.MethodPost, "/"+db+"/import", map[string]any{"action": "init", "etag": etag})
	if a.outcome() != OK {
		return done(before(a.outcome()), "init: "+a.text(), a.notD1())
	}
	var upload struct {
		UploadURL string `json:"upload_url"`
		Filename  string `json:"filename"`
	}
	if err := json.Unmarshal(a.Result, &upload); err != nil || upload.UploadURL == "" || upload.Filename == "" {
		return done(Failed, "init: "+a.text(), "200 init answer without upload_url and filename")
	}
	status, hdr, raw, err := c.rawCall(ctx, http.MethodPut, upload.UploadURL, file)
	switch {
	case status == 0:
		return done(Failed, "upload: "+err.Error(), "")
	case status != http.StatusOK:
		u := envelopeOf(status, raw)
		return done(before(u.outcome()), "upload: "+u.text(), u.notD1())
	case err != nil:
		return done(Failed, "upload answer cut short: "+err.Error(), "")
	case hdr.Get("ETag") != `"`+etag+`"`:
		// wrangler stops here: the upload is not the file it sent.
		return done(Failed, "upload: "+clip(raw), fmt.Sprintf("upload answered ETag %q, not the file's MD5 %q", hdr.Get("ETag"), etag))
	}
	type importState struct {
		Status     string   `json:"status"`
		AtBookmark string   `json:"at_bookmark"`
		Error      string   `json:"error"`
		Errors     []string `json:"errors"`
		Messages   []string `json:"messages"` // the ones new since the bookmark
	}
	// pending: a message said the import committed on the host before the
	// archive store confirmed it (durability "archived").
	pending := false
	notePending := func(st importState) {
		for _, m := range st.Messages {
			pending = pending || strings.Contains(m, archiveNotConfirmed)
		}
	}
	var st importState
	c.countSent(db)
	a = c.do(ctx, edge(), http.MethodPost, "/"+db+"/import", map[string]any{"action": "ingest", "etag": etag, "filename": upload.Filename})
	switch {
	case a.outcome() == OK:
		if err := json.Unmarshal(a.Result, &st); err != nil {
			op.Malformed = "200 ingest answer that is not an import status"
		}
	case a.outcome() == Unknown:
		op.Malformed = a.notD1()
		st.AtBookmark = upload.Filename // the host's job name; poll for it
	default:
		return done(a.outcome(), "ingest: "+a.text(), a.notD1())
	}
	last := "ingest: " + a.text()
	deadline := time.Now().Add(pollFor)
	for {
		notePending(st)
		switch st.Status {
		case "complete":
			if pending {
				// Durability "archived" and the archive store did not
				// confirm: the import applied on the host (D1's
				// "complete"), its archiving is pending. ImportsAtomic
				// holds it to all or nothing only (the host may be lost
				// before the archive catches up).
				return done(OK, ImportArchivePending+"; "+last, "")
			}
			return done(OK, last, "")
		case "error":
			mal := ""
			if st.Error == "" && len(st.Errors) == 0 {
				mal = "import status error without an error message"
			}
			// The job runs in one transaction: it ended, nothing imported
			// (a commit the archive did not confirm is "complete" with a
			// warning, above: "error" never means "applied").
			return done(Refused, last, mal)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return done(Unknown, "no final status: "+last, "")
		}
		time.Sleep(pollEvery) // D1's polling protocol: ask again until complete
		a = c.do(ctx, edge(), http.MethodPost, "/"+db+"/import", map[string]any{"action": "poll", "current_bookmark": st.AtBookmark})
		last = "poll: " + a.text()
		switch {
		case a.outcome() == OK:
			var next importState
			if err := json.Unmarshal(a.Result, &next); err != nil {
				op.Malformed = "200 poll answer that is not an import status"
				continue
			}
			st = next
		case a.status == http.StatusBadRequest && len(a.Errors) == 1 && strings.Contains(a.Errors[0].Message, "no import with that bookmark"):
			// The job's status survives a restart of its host (its job
			// file and the record its transaction commits), but not the
			// loss of the host: the database relocated from its archive
			// knows only the imports the archive holds. The import may
			// have committed on the lost host, or rolled back.
			return done(Unknown, last, "")
		default:
			if m := a.notD1(); m != "" && op.Malformed == "" {
				op.Malformed = m
			}
		}
	}
}

// ImportArchivePending starts the Answer of an import that completed while
// the archive store did not confirm it (durability "archived").
const ImportArchivePending = "complete, archive pending"

// archiveNotConfirmed is in the import status message that says so.
const archiveNotConfirmed = "archive store has not confirmed"

// ImportRead reads table imp of db through edge (after its import).
// Found is false when the table does not exist (the SQL error "no such
// table", an answer of its own: Outcome OK).
func (c *Client) ImportRead(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodPost, "/"+db+"/query", map[string]any{"sql": "SELECT v FROM imp ORDER BY v"})
	op := Op{Client: client, Kind: ImportRead, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text()}
	switch {
	case op.Outcome == OK:
		vals, err := a.column()
		if err != nil {
			op.Outcome, op.Answer = Unknown, err.Error()
			break
		}
		op.Found, op.Values = true, vals
		op.Answer = fmt.Sprintf("%d rows", len(vals))
	case a.status == http.StatusBadRequest && len(a.Errors) == 1 && strings.Contains(a.Errors[0].Message, "no such table"):
		op.Outcome = OK
	}
	return c.h.Add(op)
}

// Insights asks db's query insights through edge (GET …/insights, the
// last hour's shapes by count). Value is how many shapes it returned.
func (c *Client) Insights(ctx context.Context, client, edge int, db string) Op {
	call := c.h.Now()
	a := c.do(ctx, edge, http.MethodGet, "/"+db+"/insights?timePeriod=1h&sortBy=count&limit=5", nil)
	op := Op{Client: client, Kind: Insights, DB: db, Call: call, Return: c.h.Now(), Outcome: a.outcome(), Answer: a.text(), Malformed: a.notD1()}
	if op.Outcome == OK {
		var shapes []json.RawMessage
		if err := json.Unmarshal(a.Result, &shapes); err != nil {
			op.Outcome, op.Malformed = Unknown, "200 whose result is not a list of query shapes"
		}
		op.Value = int64(len(shapes))
	}
	return c.h.Add(op)
}
