// Package traffic generates client load against a Shoal deployment and
// records the call and the return of every operation, the raw material of
// the robustness suite's checkers: creates and deletes through the edge,
// gets at the edge's (stale-tolerant) level and at the catalog's
// linearizable level, row inserts whose acknowledged values must survive,
// and register writes, reads, time-travel bookmarks and restores that
// porcupine checks.
package traffic

import (
	"sync"
	"time"
)

// Kind names an operation.
type Kind string

// The operations the generators issue.
const (
	Create    Kind = "create"     // POST /database; DB is the acknowledged UUID
	Delete    Kind = "delete"     // DELETE /database/{id}
	EdgeGet   Kind = "edge-get"   // GET /database/{id}: the edge's read level (follower, route cache)
	LinGet    Kind = "lin-get"    // the catalog's linearizable read of the database row
	Insert    Kind = "insert"     // INSERT of the unique Value into the database's table t
	RegWrite  Kind = "reg-write"  // UPDATE reg SET v = Value through the edge
	RegRead   Kind = "reg-read"   // SELECT v FROM reg through the edge; Value is what it read
	Bookmark  Kind = "bookmark"   // GET …/time_travel/bookmark of a register database; Bookmark is the answer
	Restore   Kind = "restore"    // POST …/time_travel/restore?bookmark=Bookmark; Prev and After from the answer
	ListCheck Kind = "list-check" // a final list (validation, not load)
	// BoundRead: SELECT count(*) FROM t through POST /client/v4/bound/query
	// with a binding token (no API token: routes and authenticates without
	// the catalog); Value is the count.
	BoundRead Kind = "bound-read"
	// FreeInsert: INSERT of the unique Value into table t of a database of
	// a free-tier account with a low daily rows-written limit (the limiter's
	// traffic: validate.LimitEnforced); Rows is what the answer said it
	// wrote.
	FreeInsert Kind = "free-insert"
	// List: the account's databases listed through the edge (GET
	// /database, every page); Listed is what it showed.
	List Kind = "list"
	// Export: D1's export of a database the load writes (POST
	// …/export with output_format "polling" until complete, then a GET of
	// the signed URL): Call is the POST, From the download's request (the
	// dump is read from a snapshot taken after it: edge/export.go), Return
	// the end of the download; Values are the values of table t the dump
	// held. A 200 whose dump is truncated or unparsable stays OK with
	// Malformed saying why (the validator's to judge).
	Export Kind = "export"
	// Import: D1's import (init, PUT of the file to the upload URL,
	// ingest, poll until complete or error) of a small dump creating
	// table imp into a fresh database; Values are the rows the dump
	// inserts. OK is "complete"; Refused a definite refusal or a job that
	// ended in "error" (it ran in one transaction: nothing imported);
	// Failed a step before the ingest that did not answer (nothing was
	// sent that could import); Unknown an ingest or poll without a final
	// answer.
	Import Kind = "import"
	// ImportRead: SELECT v FROM imp of an import's database right after
	// the import returned; Found is whether table imp exists, Values its
	// rows.
	ImportRead Kind = "import-read"
	// Insights: GET …/insights (query shapes from the analytics store);
	// Value is how many shapes it returned.
	Insights Kind = "insights"
)

// Outcome is what the client knows of an operation's effect.
type Outcome string

const (
	// OK: acknowledged (2xx with the expected result).
	OK Outcome = "ok"
	// NotFound: a definite "no such database" (404 / 7404).
	NotFound Outcome = "not-found"
	// Refused: a definite refusal (4xx): it did not happen.
	Refused Outcome = "refused"
	// Failed: a retryable failure (503) whose answer says the request was
	// not carried out (the database was being restored; the archive store
	// was down before a restore changed anything): it did not happen.
	Failed Outcome = "failed"
	// Unknown: transport error, timeout or 5xx: it may or may not have
	// happened, and a checker must allow both.
	Unknown Outcome = "unknown"
	// Limited: refused because the account is over its daily row limit
	// (429, code 7505: the host checks the limiter's flag before running
	// anything): it did not happen.
	Limited Outcome = "limited"
)

// Op is one operation as the client saw it. Call and Return are offsets from
// the History's start, on the test process's monotonic clock.
type Op struct {
	ID     int    `json:"id"`
	Client int    `json:"client"`
	Kind   Kind   `json:"kind"`
	DB     string `json:"db,omitempty"`
	Name   string `json:"name,omitempty"`
	Value  int64  `json:"value,omitempty"`
	Found  bool   `json:"found,omitempty"` // lin-get / edge-get: the row was there
	// Rows is an acknowledged write's meta.rows_written (summed over its
	// statements).
	Rows int64 `json:"rows,omitempty"`
	// Listed is a list's answer: the UUIDs it showed.
	Listed []string `json:"listed,omitempty"`
	// Bookmark is a bookmark's answer, or the bookmark a restore asked
	// for; Prev and After are a restore's previous_bookmark (undoes it)
	// and bookmark (the point it made).
	Bookmark string        `json:"bookmark,omitempty"`
	Prev     string        `json:"prev,omitempty"`
	After    string        `json:"after,omitempty"`
	Outcome  Outcome       `json:"outcome"`
	Answer   string        `json:"answer,omitempty"` // status/code or error, for the report
	Call     time.Duration `json:"call"`
	Return   time.Duration `json:"return"`
	// Values: an export's rows of table t, an import's rows, an
	// import-read's rows of table imp.
	Values []int64 `json:"values,omitempty"`
	// From: an export's download request (0: the call).
	From time.Duration `json:"from,omitempty"`
	// Malformed says what was wrong with an answer of the export, import
	// and insights endpoints: a 200 dump that was truncated or did not
	// parse, or an error that was not a D1-style error (the v4 envelope
	// with success false and a numbered error). Empty: well formed, or no
	// HTTP answer at all (a transport error, an aborted transfer).
	Malformed string `json:"malformed,omitempty"`
	// EffectBy, for an Unknown outcome, is the latest instant its effect
	// can have happened (0: any time until the end). Set by the checkers'
	// caller from what it knows, e.g. its host was killed and restarted.
	EffectBy time.Duration `json:"effect_by,omitempty"`
}

// History is the record of every operation. Safe for concurrent use.
type History struct {
	start time.Time

	mu  sync.Mutex
	ops []Op
}

// NewHistory starts the clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the offset of this instant from the start (the clock of Op.Call,
// Op.Return and the failpoints' timeline).
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Start is the wall-clock instant offsets count from.
func (h *History) Start() time.Time { return h.start }

// Add records op, numbering it.
func (h *History) Add(op Op) Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.ops)
	h.ops = append(h.ops, op)
	return op
}

// Ops is a copy of the history so far, in the order operations returned.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}
