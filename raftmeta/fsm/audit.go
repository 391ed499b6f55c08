package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
)

// The audit log of control-plane actions: who (Audit.Actor: "token:<id>",
// "admin", "cert:<node>" …), what (the command type and its subject), when
// (Command.Time) and from where (Audit.Source, the caller's address). A
// command whose definition has an audit function writes its row in the same
// transaction as its change, so the log holds a row for every committed
// change of an audited type and for nothing refused; events outside the
// catalog (a time-travel restore on a host, a membership change) are
// recorded with record_audit by whoever performed them. Rows are pruned by
// prune_audit (the leader proposes it hourly, for rows older than the
// retention).

// Audit identifies a command's proposer (Command.Audit).
type Audit struct {
	Actor  string `json:"actor"`
	Source string `json:"source,omitempty"`
}

// AuditEntry is one row of the audit log.
type AuditEntry struct {
	ID        int64  `json:"id"`
	Time      int64  `json:"time"` // Unix ns
	Type      string `json:"type"`
	Actor     string `json:"actor"`
	Source    string `json:"source,omitempty"`
	AccountID string `json:"account_id,omitempty"`
	Subject   string `json:"subject,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// auditRow is what a command's audit function says of one application.
type auditRow struct {
	account, subject string
	detail           map[string]any
}

type auditKey struct{}

// WithAudit returns ctx carrying a: the raftmeta client stamps it on the
// commands it proposes with that context.
func WithAudit(ctx context.Context, a Audit) context.Context {
	return context.WithValue(ctx, auditKey{}, a)
}

// AuditFrom returns the Audit WithAudit put in ctx.
func AuditFrom(ctx context.Context) (Audit, bool) {
	a, ok := ctx.Value(auditKey{}).(Audit)
	return a, ok
}

const maxAuditText = 256

// recordAudit inserts c's audit row (inside c's savepoint).
func (f *FSM) recordAudit(ctx context.Context, c *Command, r auditRow) error {
	actor, source := "unknown", ""
	if c.Audit != nil {
		actor, source = clip(c.Audit.Actor), clip(c.Audit.Source)
		if actor == "" {
			actor = "unknown"
		}
	}
	detail := ""
	if len(r.detail) > 0 {
		b, err := encodeAuditDetail(r.detail) // map keys sorted: deterministic
		if err != nil {
			return err
		}
		detail = string(b)
	}
	_, err := exec(ctx, f.stmts.auditInsert, c.Time, string(c.Type), actor, source, r.account, r.subject, detail)
	return err
}

// encodeAuditDetail is json.Marshal(m) byte for byte (the detail is part of
// the catalog every replica must agree on, whatever build wrote it),
// written directly when every key and value is a plain string (a create's
// name, host and jurisdiction): encoding/json's map encoder, with its
// reflection and key sort, was most of the audit row's cost on the hottest
// command. Anything else is json.Marshal. TestEncodeAuditDetailMatchesJSON
// checks both.
func encodeAuditDetail(m map[string]any) ([]byte, error) {
	var keys [8]string
	ks := keys[:0]
	size := 2
	for k, v := range m {
		sv, ok := v.(string)
		if !ok || !plainJSONString(k) || !plainJSONString(sv) {
			return json.Marshal(m)
		}
		ks = append(ks, k)
		size += len(k) + len(sv) + 6
	}
	slices.Sort(ks)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range ks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":"`...)
		b = append(b, m[k].(string)...)
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

func clip(s string) string {
	if len(s) > maxAuditText {
		return s[:maxAuditText]
	}
	return s
}

// AuditQuery selects audit rows: newest first, with IDs below Before (0:
// from the newest), of AccountID if set, at or after Since (Unix ns) if set,
// at most Limit (default 100, at most 1,000).
type AuditQuery struct {
	AccountID string
	Before    int64
	Since     int64
	Limit     int
}

// AuditPage is a page of the audit log; Next is the Before of the next
// (older) page, 0 on the last.
type AuditPage struct {
	Entries []AuditEntry `json:"entries"`
	Next    int64        `json:"next,omitempty"`
}

// Audit reads the audit log.
func (f *FSM) Audit(ctx context.Context, q AuditQuery) (AuditPage, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	q.Limit = min(q.Limit, 1000)
	before := q.Before
	if before <= 0 {
		before = 1<<63 - 1
	}
	page := AuditPage{Entries: []AuditEntry{}}
	err := f.reader(func(db *sql.DB) error {
		query := `SELECT id, time, type, actor, source, account_id, subject, detail FROM audit_log
			WHERE id < ?1 AND time >= ?2 ORDER BY id DESC LIMIT ?3`
		args := []any{before, q.Since, q.Limit + 1}
		if q.AccountID != "" {
			query = `SELECT id, time, type, actor, source, account_id, subject, detail FROM audit_log
			WHERE account_id = ?4 AND id < ?1 AND time >= ?2 ORDER BY id DESC LIMIT ?3`
			args = append(args, q.AccountID)
		}
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var e AuditEntry
			if err := rows.Scan(&e.ID, &e.Time, &e.Type, &e.Actor, &e.Source, &e.AccountID, &e.Subject, &e.Detail); err != nil {
				return err
			}
			page.Entries = append(page.Entries, e)
		}
		return rows.Err()
	})
	if err != nil {
		return AuditPage{}, fmt.Errorf("audit log: %w", err)
	}
	if len(page.Entries) > q.Limit {
		page.Entries = page.Entries[:q.Limit]
		page.Next = page.Entries[q.Limit-1].ID
	}
	return page, nil
}
