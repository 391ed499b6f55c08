package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// CmdSetHostState is an operator's change of a host's state: declaring it
// lost (its databases are then relocated from the archive, edge/relocate.go)
// or readmitting it (back to active). Unlike register_host, which a host
// sends about itself, this is the only command that sets or clears "lost".
const CmdSetHostState CommandType = "set_host_state"

// SetHostState sets host ID's state. IdleSince, when not 0, makes it a
// compare-and-set for automatic recovery: it applies only if the host has
// not registered or reported its load after IdleSince (Unix ns, the
// proposer's reading of the bound), so a host that came back between the
// decision and the commit is not declared lost.
type SetHostState struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	IdleSince int64  `json:"idle_since,omitempty"`
}

// setHostStateCommand answers the updated Host. Refusals: no such host
// (ErrNotFound), a host that reported after IdleSince (ErrConflict).
var setHostStateCommand = command[SetHostState, *setHostStateStmts]{
	prepareS: func(p *preparer) *setHostStateStmts {
		return &setHostStateStmts{set: p.prep(`UPDATE hosts SET state = ?2 WHERE id = ?1`)}
	},
	validate: func(b *SetHostState) error {
		if err := checkID("host id", b.ID); err != nil {
			return err
		}
		if b.State != HostStateLost {
			if err := checkHostState(b.State); err != nil {
				return err
			}
		}
		if b.IdleSince < 0 {
			return fmt.Errorf("%w: idle_since %d", ErrInvalid, b.IdleSince)
		}
		return nil
	},
	apply:   applySetHostState,
	refuses: []error{ErrNotFound, ErrConflict},
	audit: func(b *SetHostState, v any) auditRow {
		return auditRow{subject: "host:" + b.ID, detail: map[string]any{"state": b.State, "automatic": b.IdleSince != 0}}
	},
}

type setHostStateStmts struct{ set *sql.Stmt }

func applySetHostState(f *FSM, ctx context.Context, _ *Command, st *setHostStateStmts, b *SetHostState) (any, error) {
	h, err := f.getHost(ctx, b.ID)
	if err != nil {
		return nil, err
	}
	if b.IdleSince > 0 && h.UpdatedAt > b.IdleSince {
		return nil, fmt.Errorf("%w: host %q reported at %d, after the idle bound %d", ErrConflict, b.ID, h.UpdatedAt, b.IdleSince)
	}
	if _, err := exec(ctx, st.set, b.ID, b.State); err != nil {
		return nil, err
	}
	return f.getHost(ctx, b.ID)
}
