package objecthost

import (
	"context"
	"time"
)

// The route feed's anti-entropy. Routes are published on confirm, on
// heartbeat repair and on delete; a publication that failed marks the
// object dirty. Heartbeats retry dirty *active* routes but skip deleted
// objects, and nothing notices a record the broker lost (a topic recreated,
// a broker restored from an old disk). Two loops close those gaps:
//
//   - every DirtyRouteRetry (default 1 min), every dirty route is
//     published again, deleted ones included;
//   - every RouteRepublishInterval (default 1 h), every confirmed route the
//     host holds (active, and deleted until swept) is published again,
//     paced at RouteRepublishRate per second so a host with a million
//     databases spreads the pass over minutes instead of flooding the
//     broker.
//
// A pass stops early after republishStopAfter consecutive failures (the
// broker is down: each attempt would wait out PublishRoute's timeout); the
// failed routes stay dirty and the next dirty retry takes them.
const republishStopAfter = 3

// RepublishRoutes publishes again the route of every dirty object (all
// false) or of every confirmed object (all true), paced at rate per second
// (≤ 0: unpaced). It returns how many publications succeeded and failed.
func (h *Host) RepublishRoutes(ctx context.Context, all bool, rate int) (published, failed int) {
	h.mu.Lock()
	objs := make([]*object, 0, len(h.objects))
	for _, o := range h.objects {
		if all || o.routeDirty.Load() {
			objs = append(objs, o)
		}
	}
	h.mu.Unlock()
	pace := newPacer(rate, len(objs))
	defer pace.stop()
	consecutive := 0
	for _, o := range objs {
		if !pace.wait(ctx) {
			return published, failed
		}
		o.mu.Lock()
		m := o.meta.Load()
		// Unconfirmed active objects have no route yet (the create's
		// checkpoint decides), and swept ones are gone.
		if o.gone || m == nil || (!m.Confirmed && !m.deleted()) {
			o.mu.Unlock()
			continue
		}
		h.publishLocked(ctx, o, m)
		ok := !o.routeDirty.Load()
		o.mu.Unlock()
		if ok {
			published++
			consecutive = 0
			continue
		}
		failed++
		if consecutive++; consecutive >= republishStopAfter {
			h.log.Warn("route republication stopped: the broker is not acknowledging; dirty routes are retried later",
				"published", published, "failed", failed)
			return published, failed
		}
	}
	return published, failed
}

// startRouteRepublish starts the two anti-entropy loops (see above).
func (h *Host) startRouteRepublish(ctx context.Context) {
	if _, none := h.cfg.Routes.(discard); none {
		return
	}
	if h.cfg.DirtyRouteRetry > 0 {
		h.goEvery(ctx, h.cfg.DirtyRouteRetry, func(ctx context.Context) { h.RepublishRoutes(ctx, false, h.cfg.RouteRepublishRate) })
	}
	if h.cfg.RouteRepublishInterval > 0 {
		h.goEvery(ctx, h.cfg.RouteRepublishInterval, func(ctx context.Context) {
			p, f := h.RepublishRoutes(ctx, true, h.cfg.RouteRepublishRate)
			h.log.Info("routes republished (anti-entropy)", "published", p, "failed", f)
		})
	}
}

// pacer spaces a pass over n items at rate per second: unpaced when rate
// ≤ 0 or the pass fits in a second anyway.
type pacer struct{ t *time.Ticker }

func newPacer(rate, n int) pacer {
	if rate > 0 && n > rate {
		return pacer{time.NewTicker(time.Second / time.Duration(rate))}
	}
	return pacer{}
}

// wait returns when the next item may go, false once ctx is done.
func (p pacer) wait(ctx context.Context) bool {
	if p.t == nil {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-p.t.C:
		return true
	}
}

func (p pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}
