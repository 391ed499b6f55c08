package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// CmdReportHostLoad records a host's reported load.
const CmdReportHostLoad CommandType = "report_host_load"

type ReportHostLoad struct {
	ID        string `json:"id"`
	Databases int64  `json:"databases"`
	Bytes     int64  `json:"bytes"`
}

// reportHostLoadCommand answers the Host; an unknown host is ErrNotFound.
var reportHostLoadCommand = command[ReportHostLoad, *reportHostLoadStmts]{
	prepareS: func(p *preparer) *reportHostLoadStmts {
		return &reportHostLoadStmts{load: p.prep(`UPDATE hosts SET databases = ?2, bytes = ?3, updated_at = ?4 WHERE id = ?1`)}
	},
	validate: validateReportHostLoad,
	apply:    applyReportHostLoad,
	refuses:  []error{ErrNotFound},
}

type reportHostLoadStmts struct{ load *sql.Stmt }

func validateReportHostLoad(b *ReportHostLoad) error {
	if err := checkID("host id", b.ID); err != nil {
		return err
	}
	if b.Databases < 0 || b.Bytes < 0 {
		return fmt.Errorf("%w: negative host load", ErrInvalid)
	}
	return nil
}

func applyReportHostLoad(f *FSM, ctx context.Context, c *Command, st *reportHostLoadStmts, b *ReportHostLoad) (any, error) {
	n, err := exec(ctx, st.load, b.ID, b.Databases, b.Bytes, c.Time)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: host %q", ErrNotFound, b.ID)
	}
	return f.getHost(ctx, b.ID)
}
