package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/hashicorp/raft"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// fatalError is a failure of the catalog itself (I/O, corruption), not a
// refusal of the command. Such a failure is not deterministic across
// replicas, so answering it as a refusal would let replicas diverge; Apply
// panics instead and the node restarts from snapshot + log.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return "fsm storage failure: " + e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// storageErr classifies a database error inside a command. A constraint
// violation is a deterministic outcome of the catalog's content (every
// replica hits it identically), so it is a refusal; anything else is fatal.
func storageErr(err error) error {
	var se sqlite3.Error
	if errors.As(err, &se) && se.Code == sqlite3.ErrConstraint {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return &fatalError{err: err}
}

func (f *FSM) fatal(index uint64, err error) {
	var old *BuildTooOldError
	if errors.As(err, &old) {
		panic(&HaltError{Index: index, Err: old})
	}
	panic(fmt.Sprintf("fsm: apply log index %d: %v", index, err))
}

// HaltError is the panic value of a replica that must not go on applying
// its log (today: BuildTooOldError). raftmeta logs it before the process
// ends.
type HaltError struct {
	Index uint64
	Err   error
}

func (e *HaltError) Error() string {
	if e.Index == 0 {
		return fmt.Sprintf("fsm: restore: %v", e.Err)
	}
	return fmt.Sprintf("fsm: log index %d: %v", e.Index, e.Err)
}
func (e *HaltError) Unwrap() error { return e.Err }

// Apply applies one log entry in its own transaction. It returns a Result
// (value type) for every entry.
func (f *FSM) Apply(l *raft.Log) interface{} {
	res := f.ApplyBatch([]*raft.Log{l})
	if res[0] == nil {
		return Result{Index: l.Index}
	}
	return res[0]
}

// ApplyBatch applies entries in one SQLite transaction (raft.BatchingFSM).
// Each command runs inside its own SAVEPOINT, so a refused command leaves no
// trace while the others in the batch commit. Entries that are not
// LogCommand get nil. The commit at the end is the checkpoint: the applied
// index and the dedupe records become visible together with the effects.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	if len(logs) == 0 {
		return out
	}
	ctx := context.Background()
	s := f.stmts
	if s == nil { // closed, or a failed Restore left no catalog: fail stop
		f.fatal(logs[0].Index, ErrUnavailable)
	}
	if _, err := s.begin.ExecContext(ctx); err != nil {
		f.fatal(logs[0].Index, err)
	}
	applied := f.applied.Load()
	for i, l := range logs {
		if l.Index > applied {
			applied = l.Index
		}
		if l.Type != raft.LogCommand {
			continue
		}
		var r any
		var err error
		if IsBatchEntry(l.Data) {
			r, err = f.applyBatchEntry(ctx, l)
		} else {
			r, err = f.applyOne(ctx, l.Data, l.Index, l.Index+f.batchOffset)
		}
		if err != nil {
			s.rollback.ExecContext(ctx) //nolint:errcheck // panicking anyway
			f.fatal(l.Index, err)
		}
		out[i] = r
	}
	if err := f.finishTx(ctx, applied); err != nil {
		s.rollback.ExecContext(ctx) //nolint:errcheck // panicking anyway
		f.fatal(applied, err)
	}
	f.commit(ctx, applied)
	return out
}

// commit commits the batch's transaction and adds its digest changes to
// the memory in one step for readers: under dig.mu, which readers hold
// shared while they pin their read snapshot and copy the digests
// (readDigestsPinned), so a reader sees either both or neither. The
// applied index moves last: a reader that waited for index i sees the
// digests of every entry <= i. A batch without digest changes does not
// take the lock (readers see the same digests before and after it).
//
// The COMMIT is the batch's checkpoint. A crash before or after it loses
// nothing: the catalog file and the digests in memory are derived state,
// rebuilt on every start from the newest snapshot and the log (New starts
// empty).
func (f *FSM) commit(ctx context.Context, applied uint64) {
	if len(f.digestBatch) == 0 {
		if _, err := f.stmts.commit.ExecContext(ctx); err != nil {
			f.fatal(applied, err)
		}
		f.applied.Store(applied)
		return
	}
	f.dig.mu.Lock()
	if _, err := f.stmts.commit.ExecContext(ctx); err != nil {
		f.fatal(applied, err) // panics with the lock held: the process is going down
	}
	f.dig.add(f.digestBatch)
	f.dig.mu.Unlock()
	clear(f.digestBatch)
	f.applied.Store(applied)
}

// finishTx prunes expired request IDs and records the apply state. Pruning
// only at the end of a transaction is deterministic because lookups apply
// the same expiry rule themselves (see dedupeThresholds): a row that expired
// but is not yet pruned is never used.
func (f *FSM) finishTx(ctx context.Context, applied uint64) error {
	s := f.stmts
	if err := f.flushActive(ctx); err != nil {
		return err
	}
	// The last entry's position (batchentry.go): its index in a log
	// without batch entries.
	f.dd.prune(f.dedupeThresholds(applied + f.batchOffset))
	if _, err := s.metaSet.ExecContext(ctx, "applied_index", strconv.FormatUint(applied, 10)); err != nil {
		return err
	}
	if f.batchOffset > 0 { // absent until a batch entry: the catalog of a log without them is a previous build's
		if _, err := s.metaPut.ExecContext(ctx, batchOffsetKey, strconv.FormatUint(f.batchOffset, 10)); err != nil {
			return err
		}
	}
	if _, err := s.metaSet.ExecContext(ctx, "max_time", strconv.FormatInt(f.maxTime, 10)); err != nil {
		return err
	}
	return nil
}

// dedupeThresholds: a remembered request counts while its ts >= tsMin (the
// window measured back from the largest Command.Time applied so far, which
// only grows, so a proposer with a slow clock cannot resurrect anything) and
// its position > idxMax (the last dedupeMaxEntries commands). index is the
// position of the command being applied (or of the batch's last entry): its
// log index, plus batchOffset once batch entries were applied
// (batchentry.go).
func (f *FSM) dedupeThresholds(index uint64) (tsMin int64, idxMax uint64) {
	tsMin = f.maxTime - int64(f.cfg.dedupeWindow)
	if index > f.cfg.dedupeMaxEntries {
		idxMax = index - f.cfg.dedupeMaxEntries
	}
	return tsMin, idxMax
}

// applyOne applies one command (data: json.Marshal(Command), an entry's or
// one of a batch entry's) inside the open transaction. index is the log
// index of its entry (its Result's Index), pos its request-ID position
// (batchentry.go; index in a log without batch entries). It returns an
// error only for fatal failures; refusals are in Result.Err.
func (f *FSM) applyOne(ctx context.Context, data []byte, index, pos uint64) (Result, error) {
	res := Result{Index: index}
	cmd, pre, fast := decodeCreateFast(data)
	var stats SetDatabaseStats
	statsFast := false
	if !fast {
		cmd, stats, statsFast = decodeStatsFast(data)
	}
	if !fast && !statsFast {
		if err := json.Unmarshal(data, &cmd); err != nil {
			res.Err = ToError(fmt.Errorf("%w: malformed command: %v", ErrInvalid, err))
			return res, nil
		}
	}
	// Envelope checks. These refusals are a pure function of the entry, so
	// they are not remembered: a retry gets the same answer anyway.
	if err := checkEnvelope(&cmd); err != nil {
		res.Err = ToError(err)
		return res, nil
	}
	// The level gate, at the same place and with the same effect (none) as
	// an older build's unknown_command for a command it does not know.
	if err := f.checkLevel(cmd.Type); err != nil {
		res.Err = ToError(err)
		return res, nil
	}
	if cmd.Time > f.maxTime {
		f.maxTime = cmd.Time
	}
	s := f.stmts

	// Dedupe: a retried command is answered with the original Result.
	if prev := f.dd.get(cmd.RequestID); prev != nil {
		tsMin, idxMax := f.dedupeThresholds(pos)
		if prev.ts >= tsMin && prev.index > idxMax {
			var orig Result
			if err := json.Unmarshal(prev.result, &orig); err != nil {
				return res, &fatalError{fmt.Errorf("decode remembered result of %q: %w", cmd.RequestID, err)}
			}
			return orig, nil
		}
	}

	var err error
	if !fast {
		// Any other command may read or write active_databases: it sees
		// the creates before it. (Before the savepoint: a refusal's
		// rollback must not undo them.)
		if err := f.flushActive(ctx); err != nil {
			return res, &fatalError{err}
		}
	}
	// A command that refuses only before its first write runs without a
	// savepoint (command.refusesBeforeWrites): a refusal has nothing to undo.
	sp := s.cmds[cmd.Type].spec.savepoint()
	if sp {
		if _, err := s.savepoint.ExecContext(ctx); err != nil {
			return res, &fatalError{err}
		}
	}
	var value any
	f.digestCmd = f.digestCmd[:0]
	switch { // the body is decoded already on the fast paths
	case fast:
		value, err = f.run(ctx, &cmd, &pre)
	case statsFast:
		value, err = f.run(ctx, &cmd, &stats)
	default:
		value, err = f.run(ctx, &cmd, nil)
	}
	var fe *fatalError
	var old *BuildTooOldError
	switch {
	case errors.As(err, &fe):
		return res, fe
	case errors.As(err, &old):
		return res, old // halt: see BuildTooOldError
	case err != nil:
		if sp {
			if _, err := s.rollbackTo.ExecContext(ctx); err != nil {
				return res, &fatalError{err}
			}
		}
		res.Err = ToError(err)
	case value != nil:
		var b []byte
		var err error
		if db, ok := value.(Database); ok {
			b, err = encodeDatabase(db)
		} else {
			b, err = json.Marshal(value)
		}
		if err != nil {
			return res, &fatalError{err}
		}
		res.Value = b
	}
	if res.Err == nil {
		f.keepDigests()
	} else {
		f.digestCmd = f.digestCmd[:0] // a refusal's digest changes go with its savepoint
	}
	if sp {
		if _, err := s.release.ExecContext(ctx); err != nil {
			return res, &fatalError{err}
		}
	}
	b, err := encodeResult(res)
	if err != nil {
		return res, &fatalError{err}
	}
	// An entry whose time is already outside the window (a proposer with a
	// slow clock) would never be used: not remembering it is the same.
	if tsMin, _ := f.dedupeThresholds(pos); cmd.Time >= tsMin {
		f.dd.put(&reqEntry{id: cmd.RequestID, index: pos, ts: cmd.Time, result: b})
	}
	return res, nil
}

// flushActive writes the active-database counts that consecutive creates
// accumulated in activeDelta: one UPDATE per account instead of one per
// create (a platform creating thousands of databases puts up to hundreds of
// its own creates in one batch). It runs before any other command and at
// the end of every batch, inside the batch's transaction, in account order.
func (f *FSM) flushActive(ctx context.Context) error {
	if len(f.activeDelta) == 0 {
		return nil
	}
	ids := make([]string, 0, len(f.activeDelta))
	for id := range f.activeDelta {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if _, err := exec(ctx, f.stmts.accountIncr, id, f.activeDelta[id]); err != nil {
			return err
		}
	}
	clear(f.activeDelta)
	return nil
}

// encodeResult is json.Marshal(res) byte for byte (the stored bytes are part
// of the catalog every replica must agree on), written directly for an
// accepted command: json.Marshal would re-scan Value, which json.Marshal
// produced compact and escaped a moment ago. Refusals take the slow path.
func encodeResult(res Result) ([]byte, error) {
	if res.Err != nil {
		return json.Marshal(res)
	}
	b := make([]byte, 0, len(res.Value)+40)
	b = append(b, `{"index":`...)
	b = strconv.AppendUint(b, res.Index, 10)
	if len(res.Value) > 0 {
		b = append(b, `,"value":`...)
		b = append(b, res.Value...)
	}
	return append(b, '}'), nil
}

func checkEnvelope(c *Command) error {
	switch {
	case c.Version > CommandVersion:
		return fmt.Errorf("%w: version %d, this build applies up to %d", ErrUnsupportedVersion, c.Version, CommandVersion)
	case c.Version < 1:
		return fmt.Errorf("%w: version %d", ErrInvalid, c.Version)
	}
	if _, ok := commands[c.Type]; !ok {
		return fmt.Errorf("%w: %.64q", ErrUnknownCommand, string(c.Type))
	}
	if err := checkID("request id", c.RequestID); err != nil {
		return err
	}
	if c.Time <= 0 {
		return fmt.Errorf("%w: command time %d", ErrInvalid, c.Time)
	}
	return nil
}

func decodeBody(c *Command, v any) error {
	if len(c.Body) == 0 || string(c.Body) == "null" {
		return fmt.Errorf("%w: %s: missing body", ErrInvalid, c.Type)
	}
	if err := json.Unmarshal(c.Body, v); err != nil {
		return fmt.Errorf("%w: %s body: %v", ErrInvalid, c.Type, err)
	}
	return nil
}

// getAccount reads an account on the write connection (inside the apply
// transaction).
func (f *FSM) getAccount(ctx context.Context, id string) (Account, error) {
	a, err := scanAccount(f.stmts.accountGet.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("%w: %q", ErrAccountNotFound, id)
	}
	if err != nil {
		return a, storageErr(err)
	}
	return a, nil
}

func (f *FSM) getDatabase(ctx context.Context, uuid string) (Database, error) {
	d, err := scanDatabase(f.stmts.dbGet.QueryRowContext(ctx, uuid))
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("%w: database %q", ErrNotFound, uuid)
	}
	if err != nil {
		return d, storageErr(err)
	}
	return d, nil
}

func exists(ctx context.Context, st *sql.Stmt, args ...any) (bool, error) {
	var one int
	err := st.QueryRowContext(ctx, args...).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, storageErr(err)
	}
	return true, nil
}

func exec(ctx context.Context, st *sql.Stmt, args ...any) (int64, error) {
	r, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, storageErr(err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, storageErr(err)
	}
	return n, nil
}

func (f *FSM) getToken(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(f.stmts.tokenGet.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("%w: token %q", ErrNotFound, id)
	}
	if err != nil {
		return t, storageErr(err)
	}
	return t, nil
}

func (f *FSM) getHost(ctx context.Context, id string) (Host, error) {
	h, err := scanHost(f.stmts.hostGet.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return h, fmt.Errorf("%w: host %q", ErrNotFound, id)
	}
	if err != nil {
		return h, storageErr(err)
	}
	return h, nil
}

// checkDatabaseRef checks the (account, database) pair that names a
// database in delete_database and update_database.
func checkDatabaseRef(accountID, uuid string) error {
	return firstErr(checkID("account id", accountID), checkUUID(uuid))
}

// activeDatabaseOf returns the database if it is active and belongs to the
// account; anything else is ErrNotFound (a deleted database is gone to its
// owner, and another account's database does not exist for this one).
// The pair has passed checkDatabaseRef.
func (f *FSM) activeDatabaseOf(ctx context.Context, accountID, uuid string) (Database, error) {
	d, err := f.getDatabase(ctx, uuid)
	if err != nil {
		return d, err
	}
	if d.State != StateActive || d.AccountID != accountID {
		return d, fmt.Errorf("%w: database %q", ErrNotFound, uuid)
	}
	return d, nil
}
