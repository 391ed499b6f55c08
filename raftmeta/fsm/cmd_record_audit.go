package fsm

import (
	"context"
	"fmt"
)

// CmdRecordAudit records an action performed outside the catalog (a
// time-travel restore on an object host, a membership change, a catalog
// restore) in the audit log.
const CmdRecordAudit CommandType = "record_audit"

// RecordAudit is one such action: Action names it ("time_travel_restore",
// "join", …), AccountID and Subject what it acted on, Detail the rest.
type RecordAudit struct {
	Action    string            `json:"action"`
	AccountID string            `json:"account_id,omitempty"`
	Subject   string            `json:"subject,omitempty"`
	Detail    map[string]string `json:"detail,omitempty"`
}

var recordAuditCommand = command[RecordAudit, noStmts]{
	validate: func(b *RecordAudit) error {
		if b.Action == "" || len(b.Action) > 64 {
			return fmt.Errorf("%w: audit action must be 1..64 bytes", ErrInvalid)
		}
		if len(b.Detail) > 16 {
			return fmt.Errorf("%w: at most 16 audit details", ErrInvalid)
		}
		return firstErr(checkText("account id", b.AccountID, maxIDBytes), checkText("subject", b.Subject, maxTextBytes))
	},
	apply: func(f *FSM, ctx context.Context, c *Command, _ noStmts, b *RecordAudit) (any, error) {
		d := map[string]any{"action": b.Action}
		for k, v := range b.Detail {
			d[clip(k)] = clip(v)
		}
		return nil, f.recordAudit(ctx, c, auditRow{account: b.AccountID, subject: b.Subject, detail: d})
	},
}
