package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// Catalog levels: the gate that lets a group of replicas running different
// builds never apply different sets of commands (raftmeta/DESIGN.md,
// "Catalog levels").
//
// Every build knows a level: the highest one whose commands it applies
// (BuildLevel). The catalog holds the cluster's level (a meta row, absent =
// 1), which only set_cluster_level moves, and only upwards. A command that
// needs a higher level than the cluster's (commandLevels in registry.go) is
// refused on every replica of a build that knows levels
// (ErrClusterLevelTooLow), and a replica of a build older than the command
// answers it unknown_command: neither writes anything, so the catalogs stay
// identical. The leader raises the level only when every server of the Raft
// configuration reports a build of at least that level (raftmeta's level
// check), so once a command is accepted every replica applies it.

// BuildLevel is the catalog level this build knows: 1 is the command set
// before levels existed, 2 adds delete_database_if (and set_cluster_level
// itself), 3 adds batch entries (LevelBatchEntry, batchentry.go: one log
// entry carrying many commands). Raise it by one, in the same change, when
// a command (or an entry format) is added that an older build would not
// apply, and give that command the new level in commandLevels.
const BuildLevel int64 = 3

// CmdSetClusterLevel raises the cluster's catalog level. Only the leader's
// level check proposes it (raftmeta: no client role may), with the lowest
// level every server reported. A level at or below the current one is a
// no-op answered with the current level; a level above the one this build
// knows halts the replica (see BuildTooOldError): carrying on would apply
// commands it cannot know the meaning of.
const CmdSetClusterLevel CommandType = "set_cluster_level"

// SetClusterLevel is the level to raise the cluster to.
type SetClusterLevel struct {
	Level int64 `json:"level"`
}

// ClusterLevelResult is the cluster's level after set_cluster_level.
type ClusterLevelResult struct {
	Level int64 `json:"level"`
}

// clusterLevelKey is the meta row holding the cluster's level. It is
// written only by a set_cluster_level that raises the level, so a catalog
// that never saw one is byte-identical to a previous build's.
const clusterLevelKey = "cluster_level"

// BuildTooOldError is the reason a replica halts: the log (set_cluster_level)
// or a snapshot holds a cluster level above the one its build knows. Apply
// panics with it (fail-stop, as for storage failures) and Restore does the
// same, so the replica stops instead of applying commands its build would
// refuse while the others apply them. Restarting it with a build of at
// least Cluster resumes it from its log.
type BuildTooOldError struct {
	Build, Cluster int64
}

func (e *BuildTooOldError) Error() string {
	return fmt.Sprintf("this build (catalog level %d) is older than the cluster (catalog level %d); upgrade it to a build of level %d or later",
		e.Build, e.Cluster, e.Cluster)
}

var setClusterLevelCommand = command[SetClusterLevel, *setClusterLevelStmts]{
	prepareS: func(p *preparer) *setClusterLevelStmts {
		return &setClusterLevelStmts{
			put: p.prep(`INSERT INTO meta (key, value) VALUES ('` + clusterLevelKey + `', ?1)
				ON CONFLICT (key) DO UPDATE SET value = excluded.value`),
		}
	},
	validate: func(b *SetClusterLevel) error {
		if b.Level < 1 {
			return fmt.Errorf("%w: cluster level %d: levels start at 1", ErrInvalid, b.Level)
		}
		return nil
	},
	apply: func(f *FSM, ctx context.Context, _ *Command, st *setClusterLevelStmts, b *SetClusterLevel) (any, error) {
		if b.Level > f.cfg.buildLevel {
			return nil, &BuildTooOldError{Build: f.cfg.buildLevel, Cluster: b.Level}
		}
		cur := f.level.Load()
		if b.Level <= cur {
			return ClusterLevelResult{Level: cur}, nil // never lowers; idempotent
		}
		if _, err := exec(ctx, st.put, strconv.FormatInt(b.Level, 10)); err != nil {
			return nil, err
		}
		// Commands later in the same batch see the new level at once: the
		// gate follows log order, whatever the batching.
		f.level.Store(b.Level)
		return ClusterLevelResult{Level: b.Level}, nil
	},
	// Nothing is written before the only refusal (validate's), and the one
	// write is a single statement.
	refusesBeforeWrites: true,
}

type setClusterLevelStmts struct{ put *sql.Stmt }

// ClusterLevel is the cluster's catalog level as of the last applied entry
// (safe from any goroutine).
func (f *FSM) ClusterLevel() int64 { return f.level.Load() }

// BuildLevel is the level this FSM applies up to: BuildLevel, or what
// WithBuildLevel set.
func (f *FSM) BuildLevel() int64 { return f.cfg.buildLevel }

// CommandLevel is the cluster level cmd needs (1 for a type this build
// does not know: it is refused as unknown_command anyway).
func CommandLevel(typ CommandType) int64 {
	if l, ok := commandLevels[typ]; ok {
		return l
	}
	return 1
}

// checkLevel refuses a command that needs a higher level than the
// cluster's. Like the envelope checks it runs before anything of the entry
// is applied or remembered (max_time included), exactly where a build that
// does not know the command answers unknown_command, so replicas of both
// builds leave the same catalog.
func (f *FSM) checkLevel(typ CommandType) error { return CheckLevel(typ, f.level.Load()) }

// CheckLevel is the refusal (ErrClusterLevelTooLow) of a command of type
// typ in a cluster at level cluster, or nil. raftmeta also asks it before
// proposing, so that a refused command does not even enter the log (where
// a replica of a build without levels but with the command would apply it).
func CheckLevel(typ CommandType, cluster int64) error {
	need := CommandLevel(typ)
	if need <= cluster {
		return nil
	}
	return fmt.Errorf("%w: %s needs catalog level %d, the cluster is at level %d: upgrade every catalog node to a build that knows level %d first (the leader then raises the level by itself)",
		ErrClusterLevelTooLow, typ, need, cluster, need)
}

// loadClusterLevel reads the cluster level row (1 when absent).
func loadClusterLevel(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int64, error) {
	var v string
	switch err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = '`+clusterLevelKey+`'`).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return 1, nil
	case err != nil:
		return 0, fmt.Errorf("read cluster level: %w", err)
	}
	l, err := strconv.ParseInt(v, 10, 64)
	if err != nil || l < 1 {
		return 0, fmt.Errorf("parse cluster level %q: bad value", v)
	}
	return l, nil
}
