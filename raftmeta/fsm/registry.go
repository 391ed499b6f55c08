package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// commands is the one table of the catalog's commands: Apply knows a
// command type only if it is here. Each entry is defined in its own file,
// cmd_<type>.go.
//
// A single literal rather than registration from each file's init(): the
// house rules forbid init() side effects, the whole set is visible (and
// reviewed) in one place, and a command cannot be registered twice or
// depend on file initialisation order. Adding a command costs this one
// line besides its file. The table is never written after initialisation.
var commands = map[CommandType]commandSpec{
	CmdCreateAccount:    createAccountCommand,
	CmdUpdateAccount:    updateAccountCommand,
	CmdCreateToken:      createTokenCommand,
	CmdRevokeToken:      revokeTokenCommand,
	CmdRegisterHost:     registerHostCommand,
	CmdReportHostLoad:   reportHostLoadCommand,
	CmdCreateDatabase:   createDatabaseCommand,
	CmdDeleteDatabase:   deleteDatabaseCommand,
	CmdDeleteDatabaseIf: deleteDatabaseIfCommand,
	CmdUpdateDatabase:   updateDatabaseCommand,
	CmdSetDatabaseStats: setDatabaseStatsCommand,
	CmdDrainStats:       drainStatsCommand,
	CmdNoop:             noopCommand,
	CmdCatalogRestored:  catalogRestoredCommand,
	CmdClaimLimitNotice: claimLimitNoticeCommand,
	CmdFenceOrphans:     fenceOrphansCommand,
	CmdRelocateDatabase: relocateDatabaseCommand,
	CmdSetHostState:     setHostStateCommand,
	CmdRecordAudit:      recordAuditCommand,
	CmdPruneAudit:       pruneAuditCommand,
	CmdSetClusterLevel:  setClusterLevelCommand,
}

// commandLevels is the catalog level each command needs
// (cmd_set_cluster_level.go): Apply refuses a command above the cluster's
// level with ErrClusterLevelTooLow. Level 1 is the command set from before
// levels existed; a command added since needs the BuildLevel of the build
// that added it (an older build answers it unknown_command). Every command
// of commands is listed (TestEveryCommandHasALevel); a level, once
// released, never changes.
var commandLevels = map[CommandType]int64{
	CmdCreateAccount:    1,
	CmdUpdateAccount:    1,
	CmdCreateToken:      1,
	CmdRevokeToken:      1,
	CmdRegisterHost:     1,
	CmdReportHostLoad:   1,
	CmdCreateDatabase:   1,
	CmdDeleteDatabase:   1,
	CmdDeleteDatabaseIf: 2,
	CmdUpdateDatabase:   1,
	CmdSetDatabaseStats: 1,
	CmdDrainStats:       1,
	CmdNoop:             1,
	CmdCatalogRestored:  1,
	CmdClaimLimitNotice: 1,
	CmdFenceOrphans:     1,
	CmdRelocateDatabase: 1,
	CmdSetHostState:     1,
	CmdRecordAudit:      1,
	CmdPruneAudit:       1,
	// Level 1 so that it can raise a level-1 cluster; the leader proposes
	// it only when every server reported a build that knows it.
	CmdSetClusterLevel: 1,
}

// envelopeRefusals are the refusals any entry can get, whatever its type:
// a malformed or future envelope, an unknown type, a type above the
// cluster's catalog level, a body that does not
// decode or fails a field check (ErrInvalid; also a constraint violation,
// see storageErr). A command lists only the refusals it adds to these.
var envelopeRefusals = []error{ErrInvalid, ErrUnknownCommand, ErrUnsupportedVersion, ErrClusterLevelTooLow}

// commandSpec is what Apply needs of a command, untyped so that one table
// holds them all. Implemented only by command[B, S].
type commandSpec interface {
	// prepare prepares the command's own statements on the write
	// connection; its result is what run gets as st.
	prepare(p *preparer) any
	// run validates and applies one command inside its savepoint. body is
	// nil (run decodes Command.Body) or a body already decoded by a fast
	// path (fastdecode.go), of the command's body type.
	run(f *FSM, ctx context.Context, c *Command, st any, body any) (any, error)
	// newBody returns a pointer to a zero body, nil for a command without
	// one (tests round-trip bodies through it).
	newBody() any
	// refusals lists the refusals the command can return beyond
	// envelopeRefusals.
	refusals() []error
	// complete reports a definition that lacks validation or apply.
	complete() error
	// savepoint reports whether Apply must run the command inside a
	// SAVEPOINT (see command.refusesBeforeWrites).
	savepoint() bool
}

// command defines one catalog command, typed by its body B and the
// statements S it prepares for itself (noStmts if none). The steps, in the
// order run calls them, and every refusal is part of the replicated state
// (Results are stored for dedupe, so replicas must agree on which check
// refuses first):
//
//  1. decode Command.Body into a B (a missing or malformed body is
//     ErrInvalid), unless bodyless;
//  2. validate: the field checks that need no catalog read, which may also
//     fill defaults in b. A check made only after a read (update_account's
//     tier, after its account lookup) stays in apply, in its place;
//  3. apply: reads and writes on the write connection, in the batch's
//     transaction; returns the Result value (JSON-encoded by Apply) or a
//     refusal. Errors of SQLite itself go through storageErr (fatal).
type command[B, S any] struct {
	bodyless bool                // Command.Body is ignored (noop)
	prepareS func(p *preparer) S // nil: no statements of its own
	validate func(b *B) error    // required
	apply    func(f *FSM, ctx context.Context, c *Command, st S, b *B) (any, error)
	refuses  []error // beyond envelopeRefusals; each must be in refusals (refusal.go)
	// audit, when set, makes every successful application write a row of
	// the audit log (audit.go) in the same savepoint.
	audit func(b *B, v any) auditRow
	// refusesBeforeWrites declares that apply decides every refusal
	// before its first write and writes with single statements that
	// cannot be refused once the first has succeeded (SQLite undoes a
	// statement that fails a constraint by itself), so a refused
	// application has written nothing and Apply runs it without a
	// SAVEPOINT: two statements fewer, and no page copied into the
	// savepoint's journal, on the hottest command (create_database). Any
	// error after the first write — the audit row's included — is then
	// fatal rather than a refusal, since nothing could undo the write.
	refusesBeforeWrites bool
}

// noStmts is S for a command that uses only the shared statements.
type noStmts struct{}

func (d command[B, S]) prepare(p *preparer) any {
	if d.prepareS == nil {
		var zero S
		return zero
	}
	return d.prepareS(p)
}

func (d command[B, S]) run(f *FSM, ctx context.Context, c *Command, st any, body any) (any, error) {
	var b *B
	if body != nil {
		b = body.(*B)
	} else {
		b = new(B)
		if !d.bodyless {
			if err := decodeBody(c, b); err != nil {
				return nil, err
			}
		}
	}
	if err := d.validate(b); err != nil {
		return nil, err
	}
	v, err := d.apply(f, ctx, c, st.(S), b)
	if err == nil && d.audit != nil {
		if err := f.recordAudit(ctx, c, d.audit(b, v)); err != nil {
			if d.refusesBeforeWrites {
				// No savepoint to undo apply's writes: fail stop. (An audit
				// row cannot violate a constraint of audit_log, so a
				// refusal here cannot happen; this keeps it that way.)
				return nil, &fatalError{fmt.Errorf("audit row after the command's writes: %w", err)}
			}
			return nil, err
		}
	}
	return v, err
}

func (d command[B, S]) savepoint() bool { return !d.refusesBeforeWrites }

func (d command[B, S]) newBody() any {
	if d.bodyless {
		return nil
	}
	return new(B)
}

func (d command[B, S]) refusals() []error { return d.refuses }

func (d command[B, S]) complete() error {
	switch {
	case d.validate == nil:
		return fmt.Errorf("command on %T has no validation", *new(B))
	case d.apply == nil:
		return fmt.Errorf("command on %T has no apply", *new(B))
	}
	return nil
}

// boundCommand is a command with its statements prepared on one catalog.
type boundCommand struct {
	spec commandSpec
	st   any
}

// preparer prepares statements on the write connection, keeping the first
// error (the prepared ones are closed with stmts).
type preparer struct {
	ctx  context.Context
	conn *sql.Conn
	all  []*sql.Stmt
	err  error
}

func (p *preparer) prep(q string) *sql.Stmt {
	if p.err != nil {
		return nil
	}
	st, err := p.conn.PrepareContext(p.ctx, q)
	if err != nil {
		p.err = fmt.Errorf("prepare %q: %w", q, err)
		return nil
	}
	p.all = append(p.all, st)
	return st
}

// run applies c (its type checked by checkEnvelope) with the statements of
// its command; body as in commandSpec.run.
func (f *FSM) run(ctx context.Context, c *Command, body any) (any, error) {
	b := f.stmts.cmds[c.Type]
	return b.spec.run(f, ctx, c, b.st, body)
}
