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
// wants to delete, and (Objects) the unconfirmed objects it holds for
// databases the catalog names another object for: the leftovers of a
// lost-host relocation that never committed (relocate_database).
type FenceOrphans struct {
	HostID  string      `json:"host_id"`
	UUIDs   []string    `json:"uuids"`
	Objects []ObjectRef `json:"objects,omitempty"`
}

// ObjectRef names one object of one database.
type ObjectRef struct {
	UUID     string `json:"uuid"`
	ObjectID string `json:"object_id"`
}

// FenceAnswer says which UUIDs are fenced (no database row exists, and
// none ever will: the host may delete their objects) and which are known
// (a database row exists: keep the object, the heartbeat will apply its
// state).
//
// For Objects: FencedObjects are object IDs the catalog does not name for
// their database and never will (relocate_database refuses them), so the
// host may delete them; KnownObjects are named (a relocation to them
// committed first): keep them.
type FenceAnswer struct {
	Fenced        []string `json:"fenced"`
	Known         []string `json:"known"`
	FencedObjects []string `json:"fenced_objects,omitempty"`
	KnownObjects  []string `json:"known_objects,omitempty"`
}

// fenceOrphansCommand keeps one meta row per fenced UUID, key
// "fence/<uuid>", value the host ID; fencing a fenced UUID again is
// answered fenced. create_database checks these rows with the UUID. A
// fenced object is a row "fenceobj/<object id>", which relocate_database
// checks.
var fenceOrphansCommand = command[FenceOrphans, *fenceOrphansStmts]{
	prepareS: func(p *preparer) *fenceOrphansStmts {
		return &fenceOrphansStmts{
			known:     p.prep(`SELECT EXISTS (SELECT 1 FROM databases WHERE uuid = ?1)`),
			put:       p.prep(`INSERT INTO meta (key, value) VALUES ('fence/' || ?1, ?2) ON CONFLICT (key) DO NOTHING`),
			named:     p.prep(`SELECT EXISTS (SELECT 1 FROM databases WHERE uuid = ?1 AND object_id = ?2)`),
			putObject: p.prep(`INSERT INTO meta (key, value) VALUES ('fenceobj/' || ?1, ?2) ON CONFLICT (key) DO NOTHING`),
		}
	},
	validate: func(b *FenceOrphans) error {
		if err := checkID("host id", b.HostID); err != nil {
			return err
		}
		if n := len(b.UUIDs) + len(b.Objects); n == 0 || n > maxFence {
			return fmt.Errorf("%w: %d uuids and objects (1 to %d)", ErrInvalid, n, maxFence)
		}
		for _, u := range b.UUIDs {
			if err := checkUUID(u); err != nil {
				return err
			}
		}
		for _, o := range b.Objects {
			if err := firstErr(checkUUID(o.UUID), checkID("object id", o.ObjectID)); err != nil {
				return err
			}
		}
		return nil
	},
	apply: applyFenceOrphans,
}

type fenceOrphansStmts struct{ known, put, named, putObject *sql.Stmt }

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
	for _, o := range b.Objects {
		var named bool
		if err := st.named.QueryRowContext(ctx, o.UUID, o.ObjectID).Scan(&named); err != nil {
			return nil, storageErr(err)
		}
		if named {
			ans.KnownObjects = append(ans.KnownObjects, o.ObjectID)
			continue
		}
		if _, err := exec(ctx, st.putObject, o.ObjectID, b.HostID); err != nil {
			return nil, err
		}
		ans.FencedObjects = append(ans.FencedObjects, o.ObjectID)
	}
	return ans, nil
}
