package main

import (
	"errors"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/pflag"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// tlsFlags are every role's (and the operator commands') cluster
// credentials: the CA bundle, the node's certificate and key
// (internal/pki), or --insecure to run without them.
type tlsFlags struct {
	ca, cert, key string
	insecure      bool
}

func (f *tlsFlags) register(fs *pflag.FlagSet, insecureFlag bool) {
	fs.StringVar(&f.ca, "tls-ca", os.Getenv("SHOAL_TLS_CA"), "cluster CA bundle (PEM) for mutual TLS between components (default $SHOAL_TLS_CA; cluster.hcl's tls block)")
	fs.StringVar(&f.cert, "tls-cert", os.Getenv("SHOAL_TLS_CERT"), "this node's certificate (shoal cluster cert issue; default $SHOAL_TLS_CERT)")
	fs.StringVar(&f.key, "tls-key", os.Getenv("SHOAL_TLS_KEY"), "this node's key (default $SHOAL_TLS_KEY)")
	if insecureFlag {
		fs.BoolVar(&f.insecure, "insecure", false, "run without TLS between components: every internal endpoint answers anyone who can reach it (a trusted test network only)")
	}
}

// errNoTLS refuses a role started without credentials and without
// --insecure.
var errNoTLS = errors.New("no TLS credentials: give --tls-ca, --tls-cert and --tls-key (or a cluster.hcl tls block; shoal cluster ca init / cert issue, docs/operations.md), or --insecure to run without authentication between components on a trusted network")

// roleTLS resolves a role's credentials: flags, else cluster.hcl's tls
// block for node nodeID, else none if insecure (flag or cluster.hcl) with a
// warning, else errNoTLS.
func (f *tlsFlags) roleTLS(cl *config.Cluster, nodeID string, log *slog.Logger, role string) (*pki.Loader, error) {
	files := pki.Files{CA: f.ca, Cert: f.cert, Key: f.key}
	if !files.Enabled() && cl != nil && cl.TLS != nil {
		files.CA, files.Cert, files.Key = cl.NodeTLS(nodeID)
	}
	if files.Enabled() {
		l, err := pki.NewLoader(files)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	if f.insecure || (cl != nil && cl.Insecure) {
		log.Warn("running without TLS between components (insecure): every internal endpoint of this "+role+" answers anyone who can reach it", "role", role)
		return nil, nil
	}
	return nil, errNoTLS
}

// clientTLS resolves an operator command's credentials: none given is plain
// HTTP (a cluster running insecure).
func (f *tlsFlags) clientTLS() (*pki.Loader, error) {
	files := pki.Files{CA: f.ca, Cert: f.cert, Key: f.key}
	if !files.Enabled() {
		return nil, nil
	}
	return pki.NewLoader(files)
}

// serveTLS serves srv on ln, behind TLS when l is set (TLS outermost, so
// net/http sees the *tls.Conn and its peer).
func serveTLS(srv *v4.Server, ln net.Listener, l *pki.Loader) error {
	if l == nil {
		return srv.Serve(ln)
	}
	return srv.ServeWrapped(ln, l.Listen)
}

// nodeIDOr is a role's node ID for its certificate files: --node, else def.
func nodeIDOr(id, def string) string {
	if id != "" {
		return id
	}
	return def
}
