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
	panic(fmt.Sprintf("fsm: apply log index %d: %v", index, err))
}

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
		r, err := f.applyOne(ctx, l)
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
	if _, err := s.commit.ExecContext(ctx); err != nil {
		f.fatal(applied, err)
	}
	f.applied.Store(applied)
	return out
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
	f.dd.prune(f.dedupeThresholds(applied))
	if _, err := s.metaSet.ExecContext(ctx, "applied_index", strconv.FormatUint(applied, 10)); err != nil {
		return err
	}
	if _, err := s.metaSet.ExecContext(ctx, "max_time", strconv.FormatInt(f.maxTime, 10)); err != nil {
		return err
	}
	return nil
}

// dedupeThresholds: a remembered request counts while its ts >= tsMin (the
// window measured back from the largest Command.Time applied so far, which
// only grows, so a proposer with a slow clock cannot resurrect anything) and
// its log index > idxMax (the last dedupeMaxEntries entries).
func (f *FSM) dedupeThresholds(index uint64) (tsMin int64, idxMax uint64) {
	tsMin = f.maxTime - int64(f.cfg.dedupeWindow)
	if index > f.cfg.dedupeMaxEntries {
		idxMax = index - f.cfg.dedupeMaxEntries
	}
	return tsMin, idxMax
}

// applyOne applies one command inside the open transaction. It returns an
// error only for fatal failures; refusals are in Result.Err.
func (f *FSM) applyOne(ctx context.Context, l *raft.Log) (Result, error) {
	res := Result{Index: l.Index}
	cmd, pre, fast := decodeCreateFast(l.Data)
	var stats SetDatabaseStats
	statsFast := false
	if !fast {
		cmd, stats, statsFast = decodeStatsFast(l.Data)
	}
	if !fast && !statsFast {
		if err := json.Unmarshal(l.Data, &cmd); err != nil {
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
	if cmd.Time > f.maxTime {
		f.maxTime = cmd.Time
	}
	s := f.stmts

	// Dedupe: a retried command is answered with the original Result.
	if prev := f.dd.get(cmd.RequestID); prev != nil {
		tsMin, idxMax := f.dedupeThresholds(l.Index)
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
	if _, err := s.savepoint.ExecContext(ctx); err != nil {
		return res, &fatalError{err}
	}
	var value any
	switch { // the body is decoded already on the fast paths
	case fast:
		value, err = f.createDatabaseBody(ctx, &cmd, pre)
	case statsFast:
		value, err = f.setDatabaseStatsBody(ctx, &cmd, stats)
	default:
		value, err = f.dispatch(ctx, &cmd)
	}
	var fe *fatalError
	switch {
	case errors.As(err, &fe):
		return res, fe
	case err != nil:
		if _, err := s.rollbackTo.ExecContext(ctx); err != nil {
			return res, &fatalError{err}
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
	if _, err := s.release.ExecContext(ctx); err != nil {
		return res, &fatalError{err}
	}
	b, err := encodeResult(res)
	if err != nil {
		return res, &fatalError{err}
	}
	// An entry whose time is already outside the window (a proposer with a
	// slow clock) would never be used: not remembering it is the same.
	if tsMin, _ := f.dedupeThresholds(l.Index); cmd.Time >= tsMin {
		f.dd.put(&reqEntry{id: cmd.RequestID, index: l.Index, ts: cmd.Time, result: b})
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
	if handlerFor(c.Type) == nil {
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

type handler func(f *FSM, ctx context.Context, c *Command) (any, error)

func handlerFor(t CommandType) handler {
	switch t {
	case CmdCreateAccount:
		return (*FSM).createAccount
	case CmdUpdateAccount:
		return (*FSM).updateAccount
	case CmdCreateToken:
		return (*FSM).createToken
	case CmdRevokeToken:
		return (*FSM).revokeToken
	case CmdRegisterHost:
		return (*FSM).registerHost
	case CmdReportHostLoad:
		return (*FSM).reportHostLoad
	case CmdCreateDatabase:
		return (*FSM).createDatabase
	case CmdDeleteDatabase:
		return (*FSM).deleteDatabase
	case CmdUpdateDatabase:
		return (*FSM).updateDatabase
	case CmdSetDatabaseStats:
		return (*FSM).setDatabaseStats
	case CmdDrainStats:
		return (*FSM).drainStats
	case CmdNoop:
		return func(*FSM, context.Context, *Command) (any, error) { return nil, nil }
	}
	return nil
}

func (f *FSM) dispatch(ctx context.Context, c *Command) (any, error) {
	return handlerFor(c.Type)(f, ctx, c)
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

func (f *FSM) createAccount(ctx context.Context, c *Command) (any, error) {
	var b CreateAccount
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := firstErr(checkID("account id", b.ID), checkText("account name", b.Name, maxTextBytes),
		checkTier(b.Tier), checkLimits(b.Limits)); err != nil {
		return nil, err
	}
	if _, err := f.getAccount(ctx, b.ID); err == nil {
		return nil, fmt.Errorf("%w: account %q", ErrExists, b.ID)
	} else if !errors.Is(err, ErrAccountNotFound) {
		return nil, err
	}
	l := b.Limits
	if _, err := exec(ctx, f.stmts.accountInsert, b.ID, b.Name, b.Tier, l.MaxDatabases, l.MaxStorageBytes,
		l.MaxDatabaseBytes, l.RowsReadPerDay, l.RowsWrittenPerDay, l.HeartbeatIntervalMs, c.Time, c.Time); err != nil {
		return nil, err
	}
	return f.getAccount(ctx, b.ID)
}

func (f *FSM) updateAccount(ctx context.Context, c *Command) (any, error) {
	var b UpdateAccount
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := checkID("account id", b.ID); err != nil {
		return nil, err
	}
	a, err := f.getAccount(ctx, b.ID)
	if err != nil {
		return nil, err
	}
	if b.Tier != nil {
		if err := checkTier(*b.Tier); err != nil {
			return nil, err
		}
		a.Tier = *b.Tier
	}
	if b.Limits != nil {
		if err := checkLimits(*b.Limits); err != nil {
			return nil, err
		}
		a.Limits = *b.Limits
	}
	l := a.Limits
	if _, err := exec(ctx, f.stmts.accountUpdate, a.ID, a.Tier, l.MaxDatabases, l.MaxStorageBytes,
		l.MaxDatabaseBytes, l.RowsReadPerDay, l.RowsWrittenPerDay, l.HeartbeatIntervalMs, c.Time); err != nil {
		return nil, err
	}
	return f.getAccount(ctx, b.ID)
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

func (f *FSM) createToken(ctx context.Context, c *Command) (any, error) {
	var b CreateToken
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := firstErr(checkID("token id", b.ID), checkHash(b.Hash), checkText("token name", b.Name, maxTextBytes)); err != nil {
		return nil, err
	}
	switch {
	case b.AccountID == "" && !b.Admin:
		return nil, fmt.Errorf("%w: a non-admin token needs an account", ErrInvalid)
	case b.AccountID != "":
		if err := checkID("account id", b.AccountID); err != nil {
			return nil, err
		}
		if _, err := f.getAccount(ctx, b.AccountID); err != nil {
			return nil, err
		}
	}
	if _, err := f.getToken(ctx, b.ID); err == nil {
		return nil, fmt.Errorf("%w: token %q", ErrExists, b.ID)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if taken, err := exists(ctx, f.stmts.tokenHashExists, b.Hash); err != nil {
		return nil, err
	} else if taken {
		return nil, fmt.Errorf("%w: token hash", ErrExists)
	}
	if _, err := exec(ctx, f.stmts.tokenInsert, b.ID, b.AccountID, b.Hash, b.Name, b.Admin, c.Time); err != nil {
		return nil, err
	}
	return f.getToken(ctx, b.ID)
}

func (f *FSM) revokeToken(ctx context.Context, c *Command) (any, error) {
	var b RevokeToken
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := checkID("token id", b.ID); err != nil {
		return nil, err
	}
	if _, err := f.getToken(ctx, b.ID); err != nil {
		return nil, err
	}
	// Revoking a revoked token is a no-op (keeps the first revoked_at).
	if _, err := exec(ctx, f.stmts.tokenRevoke, b.ID, c.Time); err != nil {
		return nil, err
	}
	return f.getToken(ctx, b.ID)
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

// registerHost creates or updates a host (re-registration after an address
// or state change); the load counters are kept.
func (f *FSM) registerHost(ctx context.Context, c *Command) (any, error) {
	var b RegisterHost
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := firstErr(checkID("host id", b.ID), checkText("host address", b.Address, maxTextBytes),
		checkText("region", b.Region, maxIDBytes), checkText("jurisdiction", b.Jurisdiction, maxIDBytes),
		checkHostState(b.State)); err != nil {
		return nil, err
	}
	if b.Address == "" {
		return nil, fmt.Errorf("%w: host address is empty", ErrInvalid)
	}
	if b.Capacity < 0 {
		return nil, fmt.Errorf("%w: host capacity %d", ErrInvalid, b.Capacity)
	}
	if _, err := exec(ctx, f.stmts.hostUpsert, b.ID, b.Address, b.Region, b.Jurisdiction, b.Capacity, b.State, c.Time); err != nil {
		return nil, err
	}
	return f.getHost(ctx, b.ID)
}

func (f *FSM) reportHostLoad(ctx context.Context, c *Command) (any, error) {
	var b ReportHostLoad
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if err := checkID("host id", b.ID); err != nil {
		return nil, err
	}
	if b.Databases < 0 || b.Bytes < 0 {
		return nil, fmt.Errorf("%w: negative host load", ErrInvalid)
	}
	n, err := exec(ctx, f.stmts.hostLoad, b.ID, b.Databases, b.Bytes, c.Time)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: host %q", ErrNotFound, b.ID)
	}
	return f.getHost(ctx, b.ID)
}

func (f *FSM) createDatabase(ctx context.Context, c *Command) (any, error) {
	var b CreateDatabase
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	return f.createDatabaseBody(ctx, c, b)
}

// createDatabaseBody is createDatabase after the body is decoded (by
// decodeBody or by decodeCreateFast).
func (f *FSM) createDatabaseBody(ctx context.Context, c *Command, b CreateDatabase) (any, error) {
	if b.ReadReplication == "" {
		b.ReadReplication = ReadReplicationDisabled
	}
	if err := firstErr(checkUUID(b.UUID), checkID("account id", b.AccountID), checkName(b.Name),
		checkID("object id", b.ObjectID), checkID("host id", b.HostID),
		checkText("region", b.Region, maxIDBytes), checkText("jurisdiction", b.Jurisdiction, maxIDBytes),
		checkReadReplication(b.ReadReplication)); err != nil {
		return nil, err
	}
	s := f.stmts
	// One statement answers every question the create asks before writing
	// (it replaced five: account, uuid, name, host address). The refusals
	// keep their order: account, then UUID, then name, then limit.
	var (
		active, maxDBs int64
		uuidUsed       bool
		nameTaken      bool
		hostAddress    string
	)
	err := s.dbCreateCheck.QueryRowContext(ctx, b.AccountID, b.UUID, b.Name, b.HostID).
		Scan(&active, &maxDBs, &uuidUsed, &nameTaken, &hostAddress)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("%w: %q", ErrAccountNotFound, b.AccountID)
	case err != nil:
		return nil, storageErr(err)
	}
	// A UUID is never reused, not even after deletion: a retry with new IDs
	// must never meet an old object under the same UUID.
	if uuidUsed {
		return nil, fmt.Errorf("%w: database %q", ErrExists, b.UUID)
	}
	if nameTaken {
		return nil, fmt.Errorf("%w: %q", ErrNameTaken, b.Name)
	}
	active += f.activeDelta[b.AccountID] // creates earlier in this run of creates
	if active >= maxDBs {
		return nil, fmt.Errorf("%w: %d of %d", ErrDatabaseLimit, active, maxDBs)
	}
	if _, err := exec(ctx, s.dbInsert, b.UUID, b.AccountID, b.Name, b.ObjectID, b.HostID, b.Region,
		b.Jurisdiction, b.ReadReplication, c.Time); err != nil {
		return nil, err
	}
	// The account's active count is bumped once per run of consecutive
	// creates (flushActive), not once per create.
	f.activeDelta[b.AccountID]++
	// The new row is exactly the command's fields (a fresh database has no
	// stats and generation 1) plus the host address read above. This saves
	// re-reading the row on the hottest command.
	db := Database{UUID: b.UUID, AccountID: b.AccountID, Name: b.Name, ObjectID: b.ObjectID,
		HostID: b.HostID, HostAddress: hostAddress, Region: b.Region, Jurisdiction: b.Jurisdiction,
		ReadReplication: b.ReadReplication, State: StateActive, CreatedAt: c.Time, RoutingGeneration: 1}
	return db, nil
}

// activeDatabaseOf returns the database if it is active and belongs to the
// account; anything else is ErrNotFound (a deleted database is gone to its
// owner, and another account's database does not exist for this one).
func (f *FSM) activeDatabaseOf(ctx context.Context, accountID, uuid string) (Database, error) {
	if err := firstErr(checkID("account id", accountID), checkUUID(uuid)); err != nil {
		return Database{}, err
	}
	d, err := f.getDatabase(ctx, uuid)
	if err != nil {
		return d, err
	}
	if d.State != StateActive || d.AccountID != accountID {
		return d, fmt.Errorf("%w: database %q", ErrNotFound, uuid)
	}
	return d, nil
}

func (f *FSM) deleteDatabase(ctx context.Context, c *Command) (any, error) {
	var b DeleteDatabase
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	d, err := f.activeDatabaseOf(ctx, b.AccountID, b.UUID)
	if err != nil {
		return nil, err
	}
	s := f.stmts
	if _, err := exec(ctx, s.dbDelete, d.UUID, c.Time); err != nil {
		return nil, err
	}
	if _, err := exec(ctx, s.accountIncr, d.AccountID, -1); err != nil {
		return nil, err
	}
	// The delete trigger appends -size to the change log, so the account's
	// storage total drops by the database's last size once drained.
	if _, err := exec(ctx, s.statsDelete, d.UUID); err != nil {
		return nil, err
	}
	return f.getDatabase(ctx, d.UUID)
}

func (f *FSM) updateDatabase(ctx context.Context, c *Command) (any, error) {
	var b UpdateDatabase
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	d, err := f.activeDatabaseOf(ctx, b.AccountID, b.UUID)
	if err != nil {
		return nil, err
	}
	if b.ReadReplication != nil {
		if err := checkReadReplication(*b.ReadReplication); err != nil {
			return nil, err
		}
		if _, err := exec(ctx, f.stmts.dbSetRR, d.UUID, *b.ReadReplication); err != nil {
			return nil, err
		}
	}
	return f.getDatabase(ctx, d.UUID)
}

// StatsResult is Result.Value of SetDatabaseStats. Every stat of the
// command is counted in exactly one of the three.
type StatsResult struct {
	Applied int `json:"applied"` // stats recorded
	Skipped int `json:"skipped"` // unknown or deleted databases
	// Stale counts stats ignored because their Seq was not greater than
	// the stored one (duplicates and late deliveries). Omitted when 0, so
	// results without stale stats encode as before sequences existed.
	Stale int `json:"stale,omitempty"`
}

func (f *FSM) setDatabaseStats(ctx context.Context, c *Command) (any, error) {
	var b SetDatabaseStats
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	return f.setDatabaseStatsBody(ctx, c, b)
}

// setDatabaseStatsBody is setDatabaseStats after the body is decoded (by
// decodeBody or by decodeStatsFast).
func (f *FSM) setDatabaseStatsBody(ctx context.Context, c *Command, b SetDatabaseStats) (any, error) {
	if len(b.Stats) > MaxStatsPerCommand {
		return nil, fmt.Errorf("%w: %d stats in one command, at most %d", ErrInvalid, len(b.Stats), MaxStatsPerCommand)
	}
	for _, st := range b.Stats {
		if err := checkUUID(st.UUID); err != nil {
			return nil, err
		}
		if st.SizeBytes < 0 || st.SizeBytes > MaxDatabaseSizeBytes {
			return nil, fmt.Errorf("%w: size %d for %q out of range 0..%d", ErrInvalid, st.SizeBytes, st.UUID, int64(MaxDatabaseSizeBytes))
		}
		if st.Seq < 0 {
			return nil, fmt.Errorf("%w: seq %d for %q is negative", ErrInvalid, st.Seq, st.UUID)
		}
	}
	var r StatsResult
	s := f.stmts
	delta := map[string]int64{} // account → sum of the size changes kept
	for _, st := range b.Stats {
		var old, oldSeq int64
		var acct string
		err := s.statsGet.QueryRowContext(ctx, st.UUID).Scan(&old, &oldSeq, &acct)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// No size yet: the first one, if the database is active (the
			// insert trigger logs its delta).
			n, err := exec(ctx, s.statsInsert, st.UUID, st.SizeBytes, c.Time, st.Seq)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				r.Applied++
			} else {
				r.Skipped++
			}
			continue
		case err != nil:
			return nil, storageErr(err)
		}
		if st.Seq < oldSeq || (st.Seq == oldSeq && st.Seq != 0) {
			r.Stale++ // a duplicate or a late delivery: nothing changes
			continue
		}
		if _, err := exec(ctx, s.statsSet, st.UUID, st.SizeBytes, c.Time, st.Seq); err != nil {
			return nil, err
		}
		delta[acct] += st.SizeBytes - old
		r.Applied++
	}
	// One change row per account per command (in account order, so every
	// replica appends the same rows), not one per size.
	accts := make([]string, 0, len(delta))
	for a, d := range delta {
		if d != 0 {
			accts = append(accts, a)
		}
	}
	sort.Strings(accts)
	for _, a := range accts {
		if _, err := exec(ctx, s.changeInsert, a, delta[a]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// DrainResult is Result.Value of DrainStats.
type DrainResult struct {
	Changes  int64 `json:"changes"`  // change-log rows consumed
	Accounts int64 `json:"accounts"` // account totals updated (one update each)
}

func (f *FSM) drainStats(ctx context.Context, c *Command) (any, error) {
	var b DrainStats
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	if b.Max < 0 {
		return nil, fmt.Errorf("%w: drain max %d", ErrInvalid, b.Max)
	}
	s := f.stmts
	var minID, maxID int64
	if err := s.changesMin.QueryRowContext(ctx).Scan(&minID); err != nil {
		return nil, storageErr(err)
	}
	if minID == 0 {
		return DrainResult{}, nil
	}
	if err := s.changesMax.QueryRowContext(ctx).Scan(&maxID); err != nil {
		return nil, storageErr(err)
	}
	// Change ids are contiguous (drains delete a prefix and inserts take
	// max+1), so the first Max rows are exactly minID..minID+Max-1.
	cutoff := maxID
	if b.Max > 0 && minID+int64(b.Max)-1 < maxID {
		cutoff = minID + int64(b.Max) - 1
	}
	accounts, err := exec(ctx, s.drainUpsert, cutoff, c.Time)
	if err != nil {
		return nil, err
	}
	changes, err := exec(ctx, s.drainDelete, cutoff)
	if err != nil {
		return nil, err
	}
	return DrainResult{Changes: changes, Accounts: accounts}, nil
}
