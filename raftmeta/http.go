package raftmeta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/internal/profiling"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The internal HTTP API. Every answer is JSON: {"result": …, "meta": …} on
// success, {"error": {"code", "message", "leader"}} otherwise, with fsm's
// error codes for catalog refusals. Reads take ?consistency=linearizable|
// leader|stale and &max_stale=DURATION (Go syntax, e.g. 500ms).

const maxHeartbeatBatch = 10000

func (n *Node) handler() http.Handler {
	r := mux.NewRouter()
	cat := []string{pki.RoleCatalog}
	r.Handle("/v1/apply", n.allow(n.handleApply, everyRole...)).Methods(http.MethodPost)            // per command: authz.go
	r.Handle("/v1/apply-batch", n.allow(n.handleApplyBatch, everyRole...)).Methods(http.MethodPost) // per command: authz.go; applybatch.go
	r.Handle("/v1/read-index", n.allow(n.handleReadIndex, cat...)).Methods(http.MethodGet)

	r.Handle("/v1/databases/{uuid}", n.allow(n.handleDatabase, readers...)).Methods(http.MethodGet)
	r.Handle("/v1/accounts/{account}", n.allow(n.handleAccount, readers...)).Methods(http.MethodGet)
	r.Handle("/v1/accounts/{account}/databases", n.allow(n.handleListDatabases, pki.RoleEdge, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodGet)
	r.Handle("/v1/accounts/{account}/databases/by-name/{name}", n.allow(n.handleDatabaseByName, pki.RoleEdge, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodGet)
	r.Handle("/v1/tokens/{hash}", n.allow(n.handleToken, pki.RoleEdge, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodGet)
	r.Handle("/v1/hosts", n.allow(n.handleHosts, readers...)).Methods(http.MethodGet)
	r.Handle("/v1/hosts/{id}/databases", n.allow(n.handleHostDatabases, pki.RoleEdge, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodGet)
	r.Handle("/v1/heartbeat", n.allow(n.handleHeartbeat, pki.RoleHost, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodPost)
	r.Handle("/v1/heartbeat/digests", n.allow(n.handleHeartbeatDigests, pki.RoleHost, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodPost)
	r.Handle("/v1/audit", n.allow(n.handleAudit, pki.RoleOperator, pki.RoleEdge, pki.RoleCatalog)).Methods(http.MethodGet)
	r.Handle("/v1/storage/{kind}", n.allow(n.handleStorage, pki.RolePipeline, pki.RoleOperator, pki.RoleCatalog)).Methods(http.MethodGet) // http_stats.go

	r.Handle("/v1/cluster/bootstrap", n.allow(n.handleBootstrap, operators...)).Methods(http.MethodPost)
	r.Handle("/v1/cluster/join", n.allow(n.handleJoin, pki.RoleCatalog, pki.RoleOperator)).Methods(http.MethodPost)
	r.Handle("/v1/cluster/remove", n.allow(n.handleRemove, operators...)).Methods(http.MethodPost)
	r.Handle("/v1/cluster/status", n.allow(n.handleStatus, everyRole...)).Methods(http.MethodGet)
	r.Handle("/v1/cluster/self", n.allow(n.handleSelf, everyRole...)).Methods(http.MethodGet)
	r.Handle("/v1/cluster/snapshot", n.allow(n.handleSnapshot, operators...)).Methods(http.MethodPost)
	r.Handle("/v1/cluster/backup", n.allow(n.handleBackup, operators...)).Methods(http.MethodGet)
	r.Handle("/v1/cluster/restore", n.allow(n.handleRestore, operators...)).Methods(http.MethodPost)

	r.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]string{"status": "ok", "node": n.cfg.ID})
	})
	r.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := n.Ready()
		code := 200
		if !ok {
			code = 503
		}
		writeJSON(w, code, map[string]any{"ready": ok, "reason": why, "node": n.cfg.ID})
	})
	r.Handle("/metrics", promhttp.HandlerFor(n.metrics.reg, promhttp.HandlerOpts{}))
	// Go profiles, for operators (internal/profiling checks the role).
	r.PathPrefix(profiling.Prefix).Handler(profiling.Handler(n.cfg.TLS != nil))
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 404, map[string]wireError{"error": {Code: fsm.CodeNotFound, Message: "no such endpoint: " + r.URL.Path}})
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 405, map[string]wireError{"error": {Code: fsm.CodeInvalid, Message: "method not allowed: " + r.Method}})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n.inflight.Add(1)
		defer n.inflight.Done()
		r.ServeHTTP(w, req)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (n *Node) writeErr(w http.ResponseWriter, err error) {
	code, we := toWire(err)
	if we.Code == CodeInternal {
		n.log.Error("internal error", "err", err)
	}
	writeJSON(w, code, map[string]wireError{"error": we})
}

func invalid(format string, a ...any) error {
	return &fsm.Error{Code: fsm.CodeInvalid, Message: fmt.Sprintf(format, a...)}
}

// decodeBody decodes one JSON value, refusing unknown fields, trailing data
// and bodies over maxBodyBytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &fsm.Error{Code: CodeTooLarge, Message: fmt.Sprintf("request body over %d bytes", maxBodyBytes)}
		}
		return invalid("malformed JSON body: %v", err)
	}
	if dec.More() {
		return invalid("malformed JSON body: trailing data")
	}
	return nil
}

// validUUID accepts canonical lowercase RFC 4122 text only.
func validUUID(s string) error {
	u, err := uuid.Parse(s)
	if err != nil || u.String() != s {
		return invalid("invalid database uuid %q: want canonical lowercase form", truncate(s, 80))
	}
	return nil
}

func validID(what, s string) error {
	if s == "" || len(s) > 64 {
		return invalid("invalid %s: must be 1..64 bytes", what)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func (n *Node) setLeaderHeaders(w http.ResponseWriter) {
	if l, ok := n.leader(); ok {
		w.Header().Set(headerLeader, l.HTTPAddr)
		w.Header().Set(headerLeaderID, l.ID)
	}
}

func (n *Node) handleApply(w http.ResponseWriter, r *http.Request) {
	var cmd fsm.Command
	if err := decodeBody(w, r, &cmd); err != nil {
		n.writeErr(w, err)
		return
	}
	if err := n.checkFresh(r.Context(), &cmd); err != nil {
		n.writeErr(w, err)
		return
	}
	if !n.mayPropose(r, cmd.Type) {
		writeJSON(w, http.StatusForbidden, map[string]wireError{"error": {Code: CodeForbidden,
			Message: "the caller's certificate roles may not propose " + string(cmd.Type)}})
		return
	}
	if r.Header.Get(headerForwarded) != "" && n.raft.State() != raft.Leader {
		n.writeErr(w, n.notLeader()) // one hop only
		return
	}
	res, err := n.Apply(r.Context(), cmd)
	n.setLeaderHeaders(w)
	if err != nil {
		n.writeErr(w, err)
		return
	}
	writeApplyResponse(w, ApplyResponse{Result: res, Node: n.cfg.ID})
}

func (n *Node) handleReadIndex(w http.ResponseWriter, r *http.Request) {
	ctx, c := context.WithTimeout(r.Context(), n.cfg.ReadTimeout)
	defer c()
	idx, err := n.leaderReadIndex(ctx)
	if err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]uint64{"index": idx})
}

// readOpts parses ?consistency= and &max_stale=.
func readOpts(r *http.Request) (ReadOptions, error) {
	q := r.URL.Query()
	c, err := ParseConsistency(q.Get("consistency"))
	if err != nil {
		return ReadOptions{}, invalid("%v", err)
	}
	o := ReadOptions{Consistency: c}
	if s := q.Get("max_stale"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return o, invalid("invalid max_stale %q: want a duration such as 500ms", truncate(s, 40))
		}
		o.MaxStale = d
	}
	return o, nil
}

// serveRead runs the consistency barrier, then read, and writes the answer.
func (n *Node) serveRead(w http.ResponseWriter, r *http.Request, read func(ctx context.Context) (any, error)) {
	o, err := readOpts(r)
	if err != nil {
		n.writeErr(w, err)
		return
	}
	meta, err := n.ReadBarrier(r.Context(), o)
	if err != nil {
		n.setLeaderHeaders(w)
		n.writeErr(w, err)
		return
	}
	v, err := read(r.Context())
	if err != nil {
		n.writeErr(w, err)
		return
	}
	w.Header().Set(headerAppliedIdx, formatIndex(meta.AppliedIndex))
	// The leader this node knows, so that a client which only reads (an
	// object host's heartbeats, PreferFollowers) learns which node to
	// spare; before, only write answers carried it and such a client
	// spread its reads over all nodes, the leader included.
	n.setLeaderHeaders(w)
	writeJSON(w, 200, map[string]any{"result": v, "meta": meta})
}

func (n *Node) handleDatabase(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["uuid"]
	if err := validUUID(id); err != nil {
		n.writeErr(w, err)
		return
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.Database(ctx, id) })
}

func (n *Node) handleDatabaseByName(w http.ResponseWriter, r *http.Request) {
	acct, name := mux.Vars(r)["account"], mux.Vars(r)["name"]
	if err := validID("account id", acct); err != nil {
		n.writeErr(w, err)
		return
	}
	if err := validID("database name", name); err != nil {
		n.writeErr(w, err)
		return
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.DatabaseByName(ctx, acct, name) })
}

// DatabaseList is one page of an account's databases.
type DatabaseList struct {
	Databases []fsm.Database `json:"databases"`
	Total     int64          `json:"total"`
}

func (n *Node) handleListDatabases(w http.ResponseWriter, r *http.Request) {
	acct := mux.Vars(r)["account"]
	if err := validID("account id", acct); err != nil {
		n.writeErr(w, err)
		return
	}
	q := r.URL.Query()
	lq := fsm.ListQuery{Name: q.Get("name")}
	if len(lq.Name) > 64 {
		n.writeErr(w, invalid("name filter over 64 bytes"))
		return
	}
	for _, p := range []struct {
		key string
		dst *int
		max int
	}{{"page", &lq.Page, 1 << 30}, {"per_page", &lq.PerPage, 10000}} {
		if s := q.Get(p.key); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 0 || v > p.max {
				n.writeErr(w, invalid("invalid %s %q", p.key, truncate(s, 20)))
				return
			}
			*p.dst = v
		}
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) {
		dbs, total, err := n.cat.ListDatabases(ctx, acct, lq)
		if dbs == nil {
			dbs = []fsm.Database{}
		}
		return DatabaseList{Databases: dbs, Total: total}, err
	})
}

func (n *Node) handleAccount(w http.ResponseWriter, r *http.Request) {
	acct := mux.Vars(r)["account"]
	if err := validID("account id", acct); err != nil {
		n.writeErr(w, err)
		return
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.Account(ctx, acct) })
}

func (n *Node) handleToken(w http.ResponseWriter, r *http.Request) {
	h := mux.Vars(r)["hash"]
	if len(h) == 0 || len(h) > 128 {
		n.writeErr(w, invalid("invalid token hash"))
		return
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.TokenByHash(ctx, h) })
}

func (n *Node) handleHosts(w http.ResponseWriter, r *http.Request) {
	n.serveRead(w, r, func(ctx context.Context) (any, error) {
		hs, err := n.cat.Hosts(ctx)
		if hs == nil {
			hs = []fsm.Host{}
		}
		return hs, err
	})
}

// handleHostDatabases is GET /v1/hosts/{id}/databases?after=UUID&limit=N:
// a keyset page of the active databases on a host (fsm.HostDatabasesPage),
// for lost-host recovery; limit and consistency as for the storage pages.
func (n *Node) handleHostDatabases(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if err := validID("host id", id); err != nil {
		n.writeErr(w, err)
		return
	}
	q := r.URL.Query()
	after := q.Get("after")
	if after != "" {
		if err := validUUID(after); err != nil {
			n.writeErr(w, err)
			return
		}
	}
	limit := fsm.DefaultStoragePage
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > fsm.MaxStoragePage {
			n.writeErr(w, invalid("invalid limit %q: want 1..%d", truncate(s, 20), fsm.MaxStoragePage))
			return
		}
		limit = v
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.HostDatabasesPage(ctx, id, after, limit) })
}

// handleAudit is GET /v1/audit?account=&before=&since=&limit=: a page of
// the audit log, newest first (fsm.AuditQuery; since in Unix ns).
func (n *Node) handleAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var aq fsm.AuditQuery
	aq.AccountID = q.Get("account")
	if aq.AccountID != "" {
		if err := validID("account id", aq.AccountID); err != nil {
			n.writeErr(w, err)
			return
		}
	}
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"before", &aq.Before}, {"since", &aq.Since}} {
		if v := q.Get(p.name); v != "" {
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil || x < 0 {
				n.writeErr(w, invalid("invalid %s %q", p.name, truncate(v, 24)))
				return
			}
			*p.dst = x
		}
	}
	if v := q.Get("limit"); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x < 1 || x > 1000 {
			n.writeErr(w, invalid("invalid limit %q: want 1..1000", truncate(v, 24)))
			return
		}
		aq.Limit = x
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.Audit(ctx, aq) })
}

// HeartbeatRequest is the body of POST /v1/heartbeat.
type HeartbeatRequest struct {
	UUIDs []string `json:"uuids"`
}

func (n *Node) handleHeartbeat(w http.ResponseWriter, r *http.Request) {
	var hb HeartbeatRequest
	if err := decodeBody(w, r, &hb); err != nil {
		n.writeErr(w, err)
		return
	}
	if len(hb.UUIDs) > maxHeartbeatBatch {
		n.writeErr(w, invalid("heartbeat batch of %d over the limit of %d", len(hb.UUIDs), maxHeartbeatBatch))
		return
	}
	for _, u := range hb.UUIDs {
		if err := validUUID(u); err != nil {
			n.writeErr(w, err)
			return
		}
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.Heartbeat(ctx, hb.UUIDs) })
}

// handleHeartbeatDigests answers a host's bucket digests (fsm.DigestQuery →
// fsm.DigestAnswer): which buckets differ from the catalog's for that host,
// and the accounts asked about. Served like /v1/heartbeat (stale reads from
// followers are the hosts' default). A node of an older build answers the
// route 404 not_found, and the host falls back to per-database heartbeats;
// this route never answers not_found itself.
func (n *Node) handleHeartbeatDigests(w http.ResponseWriter, r *http.Request) {
	var q fsm.DigestQuery
	if err := decodeBody(w, r, &q); err != nil {
		n.writeErr(w, err)
		return
	}
	if err := q.Validate(); err != nil {
		n.writeErr(w, err)
		return
	}
	n.serveRead(w, r, func(ctx context.Context) (any, error) { return n.cat.HeartbeatDigests(ctx, q) })
}

// BootstrapRequest lists the initial membership (empty: this node alone).
type BootstrapRequest struct {
	Servers []JoinRequest `json:"servers"`
}

func (n *Node) handleBootstrap(w http.ResponseWriter, r *http.Request) {
	var br BootstrapRequest
	if r.ContentLength != 0 {
		if err := decodeBody(w, r, &br); err != nil {
			n.writeErr(w, err)
			return
		}
	}
	var servers []raft.Server
	for _, s := range br.Servers {
		if s.ID == "" || s.RaftAddr == "" {
			n.writeErr(w, invalid("bootstrap server needs id and raft_addr"))
			return
		}
		suf := raft.Voter
		if !s.Voter {
			suf = raft.Nonvoter
		}
		servers = append(servers, raft.Server{ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.RaftAddr), Suffrage: suf})
	}
	if err := n.BootstrapCluster(servers); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			n.writeErr(w, &fsm.Error{Code: fsm.CodeExists, Message: err.Error()})
			return
		}
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"result": "bootstrapped", "node": n.cfg.ID})
}

func (n *Node) handleJoin(w http.ResponseWriter, r *http.Request) {
	var jr JoinRequest
	if err := decodeBody(w, r, &jr); err != nil {
		n.writeErr(w, err)
		return
	}
	if err := n.Join(r.Context(), jr); err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"result": "joined", "id": jr.ID})
	n.audit(r, "join", "node:"+jr.ID, map[string]string{"raft_addr": jr.RaftAddr, "voter": strconv.FormatBool(jr.Voter)})
}

// RemoveRequest names the member to remove.
type RemoveRequest struct {
	ID string `json:"id"`
}

func (n *Node) handleRemove(w http.ResponseWriter, r *http.Request) {
	var rr RemoveRequest
	if err := decodeBody(w, r, &rr); err != nil {
		n.writeErr(w, err)
		return
	}
	if err := n.Remove(r.Context(), rr.ID); err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"result": "removed", "id": rr.ID})
	n.audit(r, "remove", "node:"+rr.ID, nil)
}

func (n *Node) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := n.Status(r.Context())
	if err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, st)
}

func (n *Node) handleSelf(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, n.Self())
}

func (n *Node) handleSnapshot(w http.ResponseWriter, _ *http.Request) {
	idx, err := n.Snapshot()
	if err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"result": "snapshot", "index": idx, "node": n.cfg.ID})
}

func (n *Node) handleBackup(w http.ResponseWriter, r *http.Request) {
	meta, rc, err := n.OpenBackup(r.Context())
	if err != nil {
		n.writeErr(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(meta.Size, 10))
	w.Header().Set("X-Shoal-Backup-Index", formatIndex(meta.Index))
	if _, err := io.Copy(w, rc); err != nil {
		// Headers are out: abort the connection so the client sees a
		// truncated body, never a complete-looking file.
		n.log.Error("backup stream failed", "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (n *Node) handleRestore(w http.ResponseWriter, r *http.Request) {
	if n.raft.State() != raft.Leader {
		n.writeErr(w, n.notLeader())
		return
	}
	body := http.MaxBytesReader(w, r.Body, 16<<30)
	if err := n.Restore(r.Context(), io.Reader(body)); err != nil {
		n.writeErr(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"result": "restored", "applied_index": n.AppliedIndex()})
	// Not in the audit log: the restore replaced it with the backup's (a
	// row written now would make the restored catalog differ from the
	// backup). The node's log keeps it.
	n.log.Warn("catalog restored from a backup", "by", peerName(r), "from", r.RemoteAddr, "applied_index", n.AppliedIndex())
}
