package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// CmdFenceOrphans fences database UUIDs an object host is about to delete
// as orphans. It closes the race between a host's orphan verdict and a
// create still in flight: a linearizable read that finds no row for a
// UUID says nothing of a create_database for it that is proposed but not
// yet committed (an edge whose catalog write was slowed by a partition or
// a leader change past the creation grace). After the fence commits,
// create_database refuses that UUID (ErrExists: a UUID is never reused),
// and the edge retries with new IDs; if the create committed first, the
// fence answers the UUID known and the host keeps its object. Whichever
// commits first wins, so an acknowledged create never loses its object.
const CmdFenceOrphans CommandType = "fence_orphans"

// maxFence bounds one fence_orphans command (a host sends its orphans of
// one heartbeat pass, already capped by its mass-orphan brake).
const maxFence = 1000

// FenceOrphans names the UUIDs HostID holds unconfirmed objects for and
// wants to delete.
type FenceOrphans struct {
	HostID string   `json:"host_id"`
	UUIDs  []string `json:"uuids"`
}

// FenceAnswer says which UUIDs are fenced (no database row exists, and
// none ever will: the host may delete their objects) and which are known
// (a database row exists: keep the object, the heartbeat will apply its
// state).
type FenceAnswer struct {
	Fenced []string `json:"fenced"`
	Known  []string `json:"known"`
}

// fenceOrphansCommand keeps one meta row per fenced UUID, key
// "fence/<uuid>", value the host ID; fencing a fenced UUID again is
// answered fenced. create_database checks these rows with the UUID.
var fenceOrphansCommand = command[FenceOrphans, *fenceOrphansStmts]{
	prepareS: func(p *preparer) *fenceOrphansStmts {
		return &fenceOrphansStmts{
			known: p.prep(`SELECT EXISTS (SELECT 1 FROM databases WHERE uuid = ?1)`),
			put:   p.prep(`INSERT INTO meta (key, value) VALUES ('fence/' || ?1, ?2) ON CONFLICT (key) DO NOTHING`),
		}
	},
	validate: func(b *FenceOrphans) error {
		if err := checkID("host id", b.HostID); err != nil {
			return err
		}
		if len(b.UUIDs) == 0 || len(b.UUIDs) > maxFence {
			return fmt.Errorf("%w: %d uuids (1 to %d)", ErrInvalid, len(b.UUIDs), maxFence)
		}
		for _, u := range b.UUIDs {
			if err := checkUUID(u); err != nil {
				return err
			}
		}
		return nil
	},
	apply: applyFenceOrphans,
}

type fenceOrphansStmts struct{ known, put *sql.Stmt }

func applyFenceOrphans(_ *FSM, ctx context.Context, _ *Command, st *fenceOrphansStmts, b *FenceOrphans) (any, error) {
	ans := FenceAnswer{Fenced: []string{}, Known: []string{}}
	for _, u := range b.UUIDs {
		var known bool
		if err := st.known.QueryRowContext(ctx, u).Scan(&known); err != nil {
			return nil, storageErr(err)
		}
		if known {
			ans.Known = append(ans.Known, u)
			continue
		}
		if _, err := exec(ctx, st.put, u, b.HostID); err != nil {
			return nil, err
		}
		ans.Fenced = append(ans.Fenced, u)
	}
	return ans, nil
}
