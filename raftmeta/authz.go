package raftmeta

import (
	"errors"
	"net/http"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Who may call what, when the node runs with TLS (Config.TLS): every
// request carries a certificate of the cluster's CA (the listener refuses
// any other), and each route admits the roles below. Catalog voters may
// call everything another voter forwards (writes, read indexes, joins);
// the caller a follower forwards for was authorised by that follower.
//
// Writes are authorised per command type as well (commandRoles): an object
// host may register itself and fence its orphans, but never mint a token
// or create an account, which only edges (their admin API) and operators
// may.

// ErrForbidden is the answer to a caller whose certificate lacks the role
// the request needs (code "forbidden"); it is final, not retried.
var ErrForbidden = errors.New("forbidden")

// CodeForbidden is ErrForbidden's wire code.
const CodeForbidden = "forbidden"

var (
	// everyRole: any certificate of the cluster.
	everyRole = pki.AllRoles
	// readers: the components that read the catalog.
	readers = []string{pki.RoleCatalog, pki.RoleEdge, pki.RoleHost, pki.RolePipeline, pki.RoleLimiter, pki.RoleOperator}
	// operators: membership, backups, restores.
	operators = []string{pki.RoleOperator}
)

// commandRoles lists, per command type, the roles that may propose it
// (besides catalog voters forwarding). A type missing here is refused:
// catalog_restored on purpose — only the leader's own restore proposes it
// (Node.Restore), so no caller under mutual TLS can make hosts believe in
// a restore (catalog voters forwarding aside).
var commandRoles = map[fsm.CommandType][]string{
	fsm.CmdCreateAccount:    {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdUpdateAccount:    {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdCreateToken:      {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdRevokeToken:      {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdRegisterHost:     {pki.RoleHost, pki.RoleOperator},
	fsm.CmdReportHostLoad:   {pki.RoleHost},
	fsm.CmdFenceOrphans:     {pki.RoleHost},
	fsm.CmdCreateDatabase:   {pki.RoleEdge},
	fsm.CmdDeleteDatabase:   {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdDeleteDatabaseIf: {pki.RoleOperator},
	fsm.CmdUpdateDatabase:   {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdSetDatabaseStats: {pki.RolePipeline},
	fsm.CmdDrainStats:       {pki.RoleOperator},
	fsm.CmdNoop:             {pki.RoleOperator},
	fsm.CmdClaimLimitNotice: {pki.RoleLimiter},
	fsm.CmdRelocateDatabase: {pki.RoleEdge, pki.RoleOperator},
	fsm.CmdSetHostState:     {pki.RoleEdge, pki.RoleOperator},
}

// allow wraps h so that only callers holding one of roles reach it (every
// caller without TLS).
func (n *Node) allow(h http.HandlerFunc, roles ...string) http.Handler {
	if n.cfg.TLS == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := pki.PeerIdentity(r.TLS)
		if !ok || !id.Has(roles...) {
			writeJSON(w, http.StatusForbidden, map[string]wireError{"error": {Code: CodeForbidden,
				Message: "the caller's certificate roles do not allow " + r.Method + " " + r.URL.Path}})
			return
		}
		h(w, r)
	})
}

// mayPropose reports whether the request's caller may propose cmd.
func (n *Node) mayPropose(r *http.Request, typ fsm.CommandType) bool {
	if n.cfg.TLS == nil {
		return true
	}
	id, ok := pki.PeerIdentity(r.TLS)
	if !ok {
		return false
	}
	if id.Has(pki.RoleCatalog) {
		return true
	}
	return id.Has(commandRoles[typ]...)
}
