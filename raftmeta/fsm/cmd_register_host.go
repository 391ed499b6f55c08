package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// CmdRegisterHost creates or updates an object host.
const CmdRegisterHost CommandType = "register_host"

type RegisterHost struct {
	ID           string `json:"id"`
	Address      string `json:"address"`
	Region       string `json:"region"`
	Jurisdiction string `json:"jurisdiction"`
	Capacity     int64  `json:"capacity"`
	State        string `json:"state"` // "active" | "draining" | "down"
}

// registerHostCommand creates or updates a host (re-registration after an
// address or state change) and answers it; the load counters are kept. A
// host an operator declared lost stays lost whatever it registers (its
// databases were relocated; the answer's State tells the host so), until
// set_host_state readmits it.
var registerHostCommand = command[RegisterHost, *registerHostStmts]{
	prepareS: func(p *preparer) *registerHostStmts {
		return &registerHostStmts{upsert: p.prep(`INSERT INTO hosts (id, address, region, jurisdiction, capacity, state, updated_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
			ON CONFLICT (id) DO UPDATE SET address = excluded.address, region = excluded.region,
			jurisdiction = excluded.jurisdiction, capacity = excluded.capacity,
			state = CASE WHEN hosts.state = 'lost' THEN 'lost' ELSE excluded.state END,
			updated_at = excluded.updated_at`)}
	},
	validate: validateRegisterHost,
	apply:    applyRegisterHost,
	audit: func(b *RegisterHost, v any) auditRow {
		return auditRow{subject: "host:" + b.ID, detail: map[string]any{"address": b.Address, "region": b.Region, "jurisdiction": b.Jurisdiction}}
	},
}

type registerHostStmts struct{ upsert *sql.Stmt }

func validateRegisterHost(b *RegisterHost) error {
	if err := firstErr(checkID("host id", b.ID), checkText("host address", b.Address, maxTextBytes),
		checkText("region", b.Region, maxIDBytes), checkText("jurisdiction", b.Jurisdiction, maxIDBytes),
		checkHostState(b.State)); err != nil {
		return err
	}
	if b.Address == "" {
		return fmt.Errorf("%w: host address is empty", ErrInvalid)
	}
	if b.Capacity < 0 {
		return fmt.Errorf("%w: host capacity %d", ErrInvalid, b.Capacity)
	}
	return nil
}

func applyRegisterHost(f *FSM, ctx context.Context, c *Command, st *registerHostStmts, b *RegisterHost) (any, error) {
	if _, err := exec(ctx, st.upsert, b.ID, b.Address, b.Region, b.Jurisdiction, b.Capacity, b.State, c.Time); err != nil {
		return nil, err
	}
	return f.getHost(ctx, b.ID)
}
