package raftmeta

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// CreateDatabases records many databases in one request (the edge's
// coalesced creates): each is its own create_database command with its own
// request ID and outcome — a refusal of one (name taken, the account's
// limit, …) leaves the others unaffected. The i-th Database and error
// answer cmds[i].
//
// Every command carries the audit record of ctx (fsm.WithAudit), as
// CreateDatabase does; CreateDatabasesAs gives each its own.
func (c *Client) CreateDatabases(ctx context.Context, cmds []fsm.CreateDatabase) ([]fsm.Database, []error) {
	var audits []*fsm.Audit
	if a, ok := fsm.AuditFrom(ctx); ok {
		audits = make([]*fsm.Audit, len(cmds))
		for i := range audits {
			audits[i] = &a
		}
	}
	return c.CreateDatabasesAs(ctx, cmds, audits)
}

// CreateDatabasesAs is CreateDatabases with the audit record of each
// create (who asked, from where) given per command: the creates of one
// batch come from different requests. audits[i] (nil, or audits shorter
// than cmds: none) goes with cmds[i]; the audit of ctx is not used.
//
// The commands are encoded, and the created databases decoded, by
// fsm.EncodeCreateDatabaseCommand and fsm.DecodeDatabase — byte for byte
// what encoding/json writes and reads, without its reflection and double
// pass over each command's body (~5% of an edge's CPU in a create phase);
// anything they decline goes through encoding/json as before.
func (c *Client) CreateDatabasesAs(ctx context.Context, cmds []fsm.CreateDatabase, audits []*fsm.Audit) ([]fsm.Database, []error) {
	out := make([]fsm.Database, len(cmds))
	errs := make([]error, len(cmds))
	bodies := make([][]byte, 0, len(cmds))
	idx := make([]int, 0, len(cmds))
	now := c.now().UnixNano()
	for i, d := range cmds {
		var audit *fsm.Audit
		if i < len(audits) && audits[i] != nil {
			a := *audits[i]
			audit = &a
		}
		b, err := encodeCreate(c.newID(), now, d, audit)
		if err != nil {
			errs[i] = err
			continue
		}
		bodies = append(bodies, b)
		idx = append(idx, i)
	}
	res := make([]fsm.Result, len(bodies))
	rerrs := make([]error, len(bodies))
	for start := 0; start < len(bodies); start += MaxApplyBatch {
		end := min(start+MaxApplyBatch, len(bodies))
		r, e := c.applyEncoded(ctx, bodies[start:end])
		copy(res[start:end], r)
		copy(rerrs[start:end], e)
	}
	for j, i := range idx {
		errs[i] = rerrs[j]
		if errs[i] == nil && len(res[j].Value) > 0 {
			if d, ok := fsm.DecodeDatabase(res[j].Value); ok {
				out[i] = d
			} else if err := json.Unmarshal(res[j].Value, &out[i]); err != nil {
				errs[i] = fmt.Errorf("decode %s result: %w", fsm.CmdCreateDatabase, err)
			}
		}
		c.invalidate(cmds[i].AccountID, cmds[i].UUID, cmds[i].Name)
	}
	return out, errs
}

// encodeCreate is json.Marshal of the create_database command (what
// fsm.NewCommand and applyBatch's fillCommand would build).
func encodeCreate(rid string, now int64, d fsm.CreateDatabase, audit *fsm.Audit) ([]byte, error) {
	if b, ok := fsm.EncodeCreateDatabaseCommand(rid, now, d, audit); ok {
		return b, nil
	}
	cmd, err := fsm.NewCommand(fsm.CmdCreateDatabase, rid, now, d)
	if err != nil {
		return nil, err
	}
	cmd.Audit = audit
	return json.Marshal(cmd)
}
