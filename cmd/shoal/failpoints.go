package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// failpointsEnv names the fault tests' hook into the edge's multi-step flows
// (edge.Options.Failpoint) and the pipeline role's consumers
// (plane.ConsumersConfig.Stalled, step "consumers:stall"):
// "step=P%[,step=P%…]", e.g. "create:after-catalog-write=30%". The failpoints start disarmed; each
// SIGUSR1 the process receives arms or disarms them all, so the robustness
// suite (test/robustness) turns a fault on and off in a running process.
// Unset (production): no hook and no signal handler.
const failpointsEnv = "SHOAL_FAILPOINTS"

// envFailpoints returns the hook SHOAL_FAILPOINTS describes, or nil. The
// handler goroutine ends with ctx.
func envFailpoints(ctx context.Context, logger *slog.Logger) (func(step string) error, error) {
	spec := os.Getenv(failpointsEnv)
	if spec == "" {
		return nil, nil
	}
	odds := map[string]float64{}
	for _, part := range strings.Split(spec, ",") {
		step, pct, ok := strings.Cut(strings.TrimSpace(part), "=")
		p, err := strconv.ParseFloat(strings.TrimSuffix(pct, "%"), 64)
		if !ok || step == "" || err != nil || p < 0 || p > 100 {
			return nil, fmt.Errorf("%s: %q is not step=P%%", failpointsEnv, part)
		}
		odds[step] = p / 100
	}
	var armed atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				logger.Warn("failpoints toggled", "armed", !armed.Load(), "spec", spec)
				armed.Store(!armed.Load())
			}
		}
	}()
	return func(step string) error {
		if p, ok := odds[step]; ok && armed.Load() && rand.Float64() < p {
			return fmt.Errorf("failpoint %s injected", step)
		}
		return nil
	}, nil
}
