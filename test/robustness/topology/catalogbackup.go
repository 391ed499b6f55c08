package topology

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// CLI runs `shoal args...` from the test's namespace as an operator would
// (with the test's certificate under Options.TLS) and returns its combined
// output.
func (c *Cluster) CLI(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, c.bin, append(args, c.cliSec...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("shoal %s: %w: %s", strings.Join(args, " "), err, tailOf(string(out), 2000))
	}
	return string(out), nil
}

// BackupCatalog writes a backup of the catalog to file with `shoal cluster
// backup`, asking the leader (any node can answer; the leader is the one
// sure to be current), retried until within has passed.
func (c *Cluster) BackupCatalog(ctx context.Context, file string, within time.Duration) (string, error) {
	return c.onLeader(ctx, within, func(ctx context.Context, l *Member) (string, error) {
		return c.CLI(ctx, "cluster", "backup", "-o", file, "--addr", l.Addr)
	})
}

// RestoreCatalog replaces the catalog with the backup in file (`shoal
// cluster restore`, which must be sent to the leader), retried until within
// has passed: a leader change between finding the leader and the call
// answers "not the leader", and nothing changed.
func (c *Cluster) RestoreCatalog(ctx context.Context, file string, within time.Duration) (string, error) {
	return c.onLeader(ctx, within, func(ctx context.Context, l *Member) (string, error) {
		return c.CLI(ctx, "cluster", "restore", file, "--addr", l.Addr)
	})
}

func (c *Cluster) onLeader(ctx context.Context, within time.Duration, call func(context.Context, *Member) (string, error)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var errs []error
	for ctx.Err() == nil {
		l, err := c.Leader(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		out, err := call(ctx, l)
		if err == nil {
			return out, nil
		}
		errs = append(errs, err)
		time.Sleep(200 * time.Millisecond)
	}
	return "", fmt.Errorf("no attempt succeeded within %s: %w", within, errors.Join(errs...))
}
