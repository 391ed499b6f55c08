package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/logging"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// logFlags are --log-format and --log-level, the same on every serve
// command and `shoal dev`.
type logFlags struct{ format, level string }

func (l *logFlags) register(f *pflag.FlagSet, defaultLevel string) {
	f.StringVar(&l.format, "log-format", logging.FormatText, "log format on stderr: text (key=value) or json (one object per line)")
	f.StringVar(&l.level, "log-level", defaultLevel, "log level: debug, info, warn or error")
}

// announce prints a role's "serving" banner: on out (stdout) for people,
// or, with --log-format json, as an info record of lg, so that a log
// collector reading both streams sees only JSON.
func (l *logFlags) announce(out io.Writer, lg *slog.Logger, format string, args ...any) {
	if strings.EqualFold(l.format, logging.FormatJSON) {
		lg.Info(fmt.Sprintf(format, args...))
		return
	}
	fmt.Fprintf(out, format+"\n", args...)
}

// logger is the role's logger on stderr. It also becomes slog's default,
// which routes the standard library's log package (and the libraries that
// log through it) into the same format, so no line of the process is in
// another one.
func (l *logFlags) logger() (*slog.Logger, error) {
	lg, err := logging.New(os.Stderr, l.format, l.level)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(lg)
	return lg, nil
}

// bindingKeys is the keyring of --binding-key, or nil when it is empty
// (binding tokens disabled).
//
// previous are earlier secrets still accepted (--binding-key-previous):
// rotate by making the new secret current and the old one previous on
// every object host first, then on every edge; drop the old one once the
// tokens it sealed have expired (7 days at most).
func bindingKeys(secret string, previous []string) (*binding.Keyring, error) {
	if secret == "" {
		return nil, nil
	}
	k, err := binding.KeyringFromSecrets(secret, previous...)
	if err != nil {
		return nil, fmt.Errorf("--binding-key: %w", err)
	}
	return k, nil
}

// serveRole serves srv on addr until ctx ends (a signal) or serving fails,
// then shuts the HTTP server down (in-flight requests finish, up to 30 s)
// and only then closes the role (closeRole), so nothing still running
// uses what it closes. started is told the bound address.
//
// tlsL, when set, puts the listener behind mutual TLS (internal/pki): the
// internal listeners of the catalog, hosts, pipeline and limiter; the
// edge's public API is served without it (nil).
func serveRole(ctx context.Context, addr string, srv *v4.Server, tlsL *pki.Loader, started func(net.Addr), closeRole func() error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(err, closeRole())
	}
	served := make(chan error, 1)
	go func() { served <- serveTLS(srv, ln, tlsL) }()
	started(ln.Addr())
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, closeRole())
}
