package limiter

import (
	"context"
	"errors"
	"time"
)

// pendingNotice is a claimed notice not yet accepted by every channel.
type pendingNotice struct {
	n    Notice
	left map[string]*channelRetry // by channel name
}

type channelRetry struct {
	notifier Notifier
	next     time.Time     // wall clock of the next attempt
	wait     time.Duration // the backoff after the next failure
}

func (l *Limiter) enqueue(n Notice) {
	if len(l.notifiers) == 0 {
		l.log.Info("limit notice claimed; no notifier configured", "account", n.AccountID, "day", n.Day)
		return
	}
	p := &pendingNotice{n: n, left: map[string]*channelRetry{}}
	for _, nt := range l.notifiers {
		p.left[nt.Name()] = &channelRetry{notifier: nt, wait: l.cfg.NoticeRetryMin}
	}
	l.nmu.Lock()
	l.pending = append(l.pending, p)
	l.nmu.Unlock()
	select {
	case l.nwake <- struct{}{}:
	default:
	}
}

func (l *Limiter) pendingCount() int {
	l.nmu.Lock()
	defer l.nmu.Unlock()
	return len(l.pending)
}

// noticeLoop delivers claimed notices, one attempt at a time, retrying
// each failed channel with backoff until the notice's day ends. It keeps
// delivering whether or not this limiter is still active: the claim is
// this instance's, and no other limiter will send it.
func (l *Limiter) noticeLoop(ctx context.Context) {
	defer l.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := l.deliverDue(ctx)
		if ctx.Err() != nil {
			return
		}
		d := time.Hour
		if !next.IsZero() {
			d = max(time.Until(next), 0)
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return
		case <-l.nwake:
		case <-timer.C:
		}
	}
}

// deliverDue attempts every due channel of every pending notice and
// returns when the next attempt is due (zero: nothing pending).
func (l *Limiter) deliverDue(ctx context.Context) time.Time {
	l.nmu.Lock()
	work := append([]*pendingNotice(nil), l.pending...)
	l.nmu.Unlock()
	var next time.Time
	for _, p := range work {
		for name, c := range p.left {
			if ctx.Err() != nil {
				return time.Time{}
			}
			if !l.cfg.Now().Before(p.n.Until) {
				l.m.noticesDropped.WithLabelValues(name).Inc()
				l.log.Error("notice not delivered: the limit lifted first", "account", p.n.AccountID, "day", p.n.Day, "channel", name)
				delete(p.left, name)
				continue
			}
			if time.Now().Before(c.next) {
				if next.IsZero() || c.next.Before(next) {
					next = c.next
				}
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := c.notifier.Send(sctx, p.n)
			cancel()
			switch {
			case err == nil:
				l.m.noticesSent.WithLabelValues(name).Inc()
				l.log.Info("limit notice sent", "account", p.n.AccountID, "day", p.n.Day, "channel", name)
				delete(p.left, name)
			case ctx.Err() != nil:
				return time.Time{}
			case errors.Is(err, ErrPermanent):
				l.m.noticeErrors.WithLabelValues(name).Inc()
				l.m.noticesDropped.WithLabelValues(name).Inc()
				l.log.Error("notice not delivered: permanent failure", "account", p.n.AccountID, "day", p.n.Day, "channel", name, "err", err)
				delete(p.left, name)
			default:
				l.m.noticeErrors.WithLabelValues(name).Inc()
				c.next = time.Now().Add(c.wait)
				l.log.Warn("notice failed; retrying", "account", p.n.AccountID, "day", p.n.Day, "channel", name, "in", c.wait, "err", err)
				c.wait = min(2*c.wait, l.cfg.NoticeRetryMax)
				if next.IsZero() || c.next.Before(next) {
					next = c.next
				}
			}
		}
	}
	l.nmu.Lock()
	kept := l.pending[:0]
	for _, p := range l.pending {
		if len(p.left) > 0 {
			kept = append(kept, p)
		}
	}
	clear(l.pending[len(kept):])
	l.pending = kept
	l.nmu.Unlock()
	return next
}
