package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Reasons of the records the limiter publishes on `limits`.
const (
	ReasonRowsRead    = "rows_read_per_day"
	ReasonRowsWritten = "rows_written_per_day"
	// ReasonTierChanged clears a flag (UntilMs = the time of the change).
	ReasonTierChanged = "tier_changed"
)

// DefaultGroup is the consumer group of `accounts` the limiters share; the
// member owning partition 0 is the active limiter.
const DefaultGroup = "shoal-limiter"

// Thresholds are a tier's daily row limits. 0 means unlimited.
type Thresholds struct {
	RowsReadPerDay    int64 `json:"rows_read_per_day"`
	RowsWrittenPerDay int64 `json:"rows_written_per_day"`
}

// FreeTier is D1's free tier: 5,000,000 rows read and 100,000 rows
// written per day.
var FreeTier = Thresholds{RowsReadPerDay: 5_000_000, RowsWrittenPerDay: 100_000}

// NotifyConfig selects the built-in notifiers; each is on when set.
type NotifyConfig struct {
	SMTP    *SMTPConfig
	Webhook *WebhookConfig
}

// Config configures a Limiter.
type Config struct {
	Kafka   plane.Kafka
	Store   Usage   // *chsink.Store
	Catalog Catalog // *raftmeta.Client
	// Free is the free tier's thresholds (default FreeTier); an account's
	// own non-zero Limits.RowsReadPerDay/RowsWrittenPerDay win over them.
	Free Thresholds
	// FloorRead and FloorWritten, when non-zero and below Free, are what
	// the ClickHouse query asks for instead, so that accounts whose own
	// limits are lower than the tier's are found too.
	FloorRead, FloorWritten int64
	// Interval between passes (default 10 s).
	Interval time.Duration
	// Notify and Notifiers are the channels (both may be used).
	Notify    NotifyConfig
	Notifiers []Notifier
	// NoticeRetryMin/Max bound the backoff between attempts at a notice
	// (default 1 s and 5 min); a notice is retried until its day ends.
	NoticeRetryMin, NoticeRetryMax time.Duration
	// Group is the consumer group of `accounts` (default DefaultGroup).
	Group string
	// Holder names this instance in claims and event IDs (default
	// hostname/pid/start time, unique across restarts).
	Holder string
	// ClientOptions are appended to both Kafka clients' options (tests).
	ClientOptions []kgo.Opt
	// SessionTimeout of the group (default 10 s: a killed limiter hands
	// over within about that).
	SessionTimeout time.Duration
	Now            func() time.Time // day boundaries (default time.Now)
	Registerer     prometheus.Registerer
	Logger         *slog.Logger
}

// Limiter is one limiter process's role. Start it with Start, stop it with
// Close.
type Limiter struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	notifiers []Notifier
	prod      *kgo.Client // limits
	group     *kgo.Client // accounts, leadership
	seq       atomic.Uint64

	// passMu is held for a whole pass and by the rebalance callbacks, so
	// leadership never moves in the middle of a pass of this process.
	passMu sync.Mutex
	active atomic.Bool
	owned  map[int32]bool // accounts partitions owned; guarded by passMu

	// pubMu orders every write to `limits` with the state update after
	// it, so state and topic agree on each account's latest record.
	pubMu sync.Mutex
	day   string
	state map[string]*accountState // guarded by pubMu

	kick chan struct{}

	nmu     sync.Mutex
	pending []*pendingNotice
	nwake   chan struct{}

	stmu   sync.Mutex
	status Status

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

// accountState is what the active limiter has published today for one
// account.
type accountState struct {
	untilMs   int64  // the latest Limit's UntilMs; 0 after a clear
	cleared   bool   // the latest record is a clear
	noticeDay string // the day whose notice was claimed (by anyone)
}

// Status is /v1/status of the limiter role.
type Status struct {
	Holder         string     `json:"holder"`
	Active         bool       `json:"active"`
	Interval       string     `json:"interval"`
	Free           Thresholds `json:"free_tier"`
	Channels       []string   `json:"channels"`
	Passes         int64      `json:"passes"`
	LastPassUnix   int64      `json:"last_pass_unix,omitempty"`
	LastPassMs     int64      `json:"last_pass_duration_ms,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	AccountsOver   int        `json:"accounts_over"`
	LimitedToday   int        `json:"limited_today"`
	NoticesPending int        `json:"notices_pending"`
}

// Start checks cfg, connects to the brokers and starts the loops: the
// group member (leadership and tier changes), the passes, the notices.
func Start(cfg Config) (_ *Limiter, err error) {
	if !cfg.Kafka.Enabled() {
		return nil, errors.New("limiter: no Kafka brokers")
	}
	if cfg.Store == nil || cfg.Catalog == nil {
		return nil, errors.New("limiter: needs a usage store and a catalog")
	}
	if cfg.Free == (Thresholds{}) {
		cfg.Free = FreeTier
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.NoticeRetryMin <= 0 {
		cfg.NoticeRetryMin = time.Second
	}
	if cfg.NoticeRetryMax <= 0 {
		cfg.NoticeRetryMax = 5 * time.Minute
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Holder == "" {
		h, _ := os.Hostname()
		cfg.Holder = h + "/" + strconv.Itoa(os.Getpid()) + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	l := &Limiter{cfg: cfg, log: cfg.Logger.With("component", "limiter"), owned: map[int32]bool{},
		state: map[string]*accountState{}, kick: make(chan struct{}, 1), nwake: make(chan struct{}, 1)}
	l.notifiers = append(l.notifiers, cfg.Notifiers...)
	if cfg.Notify.SMTP != nil {
		s, err := NewSMTP(*cfg.Notify.SMTP)
		if err != nil {
			return nil, err
		}
		l.notifiers = append(l.notifiers, s)
	}
	if cfg.Notify.Webhook != nil {
		w, err := NewWebhook(*cfg.Notify.Webhook)
		if err != nil {
			return nil, err
		}
		l.notifiers = append(l.notifiers, w)
	}
	l.m = newMetrics(func() float64 { return float64(l.pendingCount()) })
	for _, n := range l.notifiers {
		l.m.noticesSent.WithLabelValues(n.Name())
		l.m.noticeErrors.WithLabelValues(n.Name())
		l.m.noticesDropped.WithLabelValues(n.Name())
		l.status.Channels = append(l.status.Channels, n.Name())
	}
	l.status.Holder, l.status.Interval, l.status.Free = cfg.Holder, cfg.Interval.String(), cfg.Free
	if r := cfg.Registerer; r != nil {
		for i, c := range l.m.all {
			if err := r.Register(c); err != nil {
				for _, c := range l.m.all[:i] {
					r.Unregister(c)
				}
				return nil, fmt.Errorf("limiter metrics: %w", err)
			}
		}
	}
	defer func() {
		if err != nil {
			l.unregister()
			if l.prod != nil {
				l.prod.Close()
			}
		}
	}()
	l.prod, err = cfg.Kafka.Client(append([]kgo.Opt{kgo.DefaultProduceTopic(event.TopicLimits),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordRetries(math.MaxInt32)}, cfg.ClientOptions...)...)
	if err != nil {
		return nil, err
	}
	l.group, err = cfg.Kafka.Client(append([]kgo.Opt{
		kgo.ConsumerGroup(cfg.Group), kgo.ConsumeTopics(event.TopicAccounts),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), // history before the first start: the passes cover it
		kgo.SessionTimeout(cfg.SessionTimeout), kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(l.assigned), kgo.OnPartitionsRevoked(l.revoked), kgo.OnPartitionsLost(l.lost),
	}, cfg.ClientOptions...)...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(3)
	go l.consumeAccounts(ctx)
	go l.passLoop(ctx)
	go l.noticeLoop(ctx)
	return l, nil
}

// Close stops the loops, leaves the group (handing leadership over at
// once) and returns when every goroutine is gone. Notices still pending
// are logged and dropped: the claim is this instance's, so no other
// limiter sends them (limiter/DESIGN.md, "Failure cases").
func (l *Limiter) Close() {
	if !l.closed.CompareAndSwap(false, true) {
		return
	}
	l.cancel()
	l.wg.Wait()
	l.group.Close() // leaves the group; the revoke callback clears active
	l.prod.Close()
	l.active.Store(false)
	l.m.active.Set(0)
	l.nmu.Lock()
	for _, p := range l.pending {
		for name := range p.left {
			l.m.noticesDropped.WithLabelValues(name).Inc()
			l.log.Error("notice not delivered: limiter closing", "account", p.n.AccountID, "day", p.n.Day, "channel", name)
		}
	}
	l.pending = nil
	l.nmu.Unlock()
	l.unregister()
}

func (l *Limiter) unregister() {
	if r := l.cfg.Registerer; r != nil {
		for _, c := range l.m.all {
			r.Unregister(c)
		}
	}
}

// Active reports whether this limiter is the one acting.
func (l *Limiter) Active() bool { return l.active.Load() }

// Holder is this instance's name in claims and event IDs.
func (l *Limiter) Holder() string { return l.cfg.Holder }

// Status is a snapshot of the limiter's state.
func (l *Limiter) Status() Status {
	l.stmu.Lock()
	st := l.status
	l.stmu.Unlock()
	st.Active = l.Active()
	st.NoticesPending = l.pendingCount()
	l.pubMu.Lock()
	for _, s := range l.state {
		if !s.cleared && s.untilMs > 0 {
			st.LimitedToday++
		}
	}
	l.pubMu.Unlock()
	return st
}

// Leadership: the member owning partition 0 of `accounts` acts.

func (l *Limiter) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	l.passMu.Lock()
	defer l.passMu.Unlock()
	for _, p := range m[event.TopicAccounts] {
		l.owned[p] = true
	}
	l.setActive()
}

func (l *Limiter) revoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	l.passMu.Lock() // waits for a pass in flight
	defer l.passMu.Unlock()
	for _, p := range m[event.TopicAccounts] {
		delete(l.owned, p)
	}
	l.setActive()
}

func (l *Limiter) lost(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	l.revoked(ctx, cl, m)
}

// setActive follows owned; called with passMu held.
func (l *Limiter) setActive() {
	now := l.owned[0]
	if was := l.active.Swap(now); was == now {
		return
	}
	if now {
		// A new term starts from nothing: what another limiter published
		// meanwhile is unknown, so every flag is republished once
		// (idempotent) and every claim proposed again (answered "taken").
		l.pubMu.Lock()
		l.state, l.day = map[string]*accountState{}, ""
		l.pubMu.Unlock()
		l.m.active.Set(1)
		l.log.Info("limiter active", "holder", l.cfg.Holder)
		select {
		case l.kick <- struct{}{}:
		default:
		}
	} else {
		l.m.active.Set(0)
		l.log.Info("limiter standing by", "holder", l.cfg.Holder)
	}
}

// consumeAccounts polls the group: it keeps the membership (and with it
// the leadership) alive and clears the flag of an account that left the
// free tier. Every member handles the tier changes of its own partitions;
// a clear is idempotent, so none is skipped for want of leadership.
func (l *Limiter) consumeAccounts(ctx context.Context) {
	defer l.wg.Done()
	for {
		fs := l.group.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				l.log.Warn("accounts fetch", "topic", t, "partition", p, "err", err)
			}
		})
		for _, r := range fs.Records() {
			if !l.handleAccount(ctx, r) {
				return
			}
			l.group.MarkCommitRecords(r)
		}
	}
}

// handleAccount returns false only when ctx ended before the record could
// be handled.
func (l *Limiter) handleAccount(ctx context.Context, r *kgo.Record) bool {
	var a event.Account
	if err := event.Decode(r.Value, &a); err != nil {
		l.log.Warn("accounts record skipped", "offset", r.Offset, "partition", r.Partition, "err", err)
		return true
	}
	if a.AccountID == "" {
		a.AccountID = string(r.Key)
	}
	if a.Tier == "" || a.Tier == fsm.TierFree {
		return true // a downgrade: the next pass limits it if it is over
	}
	wait := 100 * time.Millisecond
	for {
		if err := l.publishClear(ctx, a.AccountID, l.cfg.Now()); err == nil {
			l.log.Info("limit cleared: tier changed", "account", a.AccountID, "tier", a.Tier)
			return true
		} else {
			l.log.Warn("publishing a clear failed; retrying", "account", a.AccountID, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Publishing on `limits`.

func (l *Limiter) publish(ctx context.Context, lim event.Limit) error {
	lim.V = event.Version
	lim.EventID = event.ID{Producer: "limiter/" + l.cfg.Holder, Seq: l.seq.Add(1)}
	b, err := event.Encode(lim)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.prod.ProduceSync(ctx, &kgo.Record{Key: []byte(lim.AccountID), Value: b}).FirstErr(); err != nil {
		l.m.publishErrors.Inc()
		return fmt.Errorf("publish limit of %s: %w", lim.AccountID, err)
	}
	return nil
}

func (l *Limiter) publishClear(ctx context.Context, account string, now time.Time) error {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	if err := l.publish(ctx, event.Limit{AccountID: account, Reason: ReasonTierChanged, UntilMs: now.UnixMilli(), Time: now.UnixMilli()}); err != nil {
		return err
	}
	l.m.clearsPublished.Inc()
	s := l.entry(account)
	s.untilMs, s.cleared = 0, true
	return nil
}

// entry is account's state, created empty; called with pubMu held.
func (l *Limiter) entry(account string) *accountState {
	s := l.state[account]
	if s == nil {
		s = &accountState{}
		l.state[account] = s
	}
	return s
}

// Passes.

func (l *Limiter) passLoop(ctx context.Context) {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
		l.passMu.Lock()
		if l.active.Load() {
			pctx, cancel := context.WithTimeout(ctx, max(l.cfg.Interval, 5*time.Second))
			if err := l.pass(pctx); err != nil && ctx.Err() == nil {
				l.m.passErrors.Inc()
				l.log.Warn("limiter pass failed; retrying next interval", "err", err)
				l.stmu.Lock()
				l.status.LastError = err.Error()
				l.stmu.Unlock()
			}
			cancel()
		}
		l.passMu.Unlock()
	}
}

// dayBounds is the UTC day of t: its name and its end.
func dayBounds(t time.Time) (string, time.Time) {
	u := t.UTC()
	start := time.Date(u.Year(), u.Month(), u.Day(), 0, 0, 0, 0, time.UTC)
	return start.Format(time.DateOnly), start.AddDate(0, 0, 1)
}

// floor is the smaller positive of a and b (0 when neither is).
func floor(a, b int64) int64 {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// pass is one round: ClickHouse for today's candidates, the catalog for
// each one's tier and limits, then flags, claims and notices. Called with
// passMu held.
func (l *Limiter) pass(ctx context.Context) error {
	start := time.Now()
	now := l.cfg.Now()
	day, end := dayBounds(now)
	l.pubMu.Lock()
	if l.day != day {
		l.state, l.day = map[string]*accountState{}, day // yesterday's flags expire by themselves
	}
	l.pubMu.Unlock()
	maxRead, maxWritten := floor(l.cfg.Free.RowsReadPerDay, l.cfg.FloorRead), floor(l.cfg.Free.RowsWrittenPerDay, l.cfg.FloorWritten)
	if maxRead <= 0 {
		maxRead = math.MaxInt64
	}
	if maxWritten <= 0 {
		maxWritten = math.MaxInt64
	}
	cands, err := l.cfg.Store.AccountsOver(ctx, now, maxRead, maxWritten)
	if err != nil {
		return err
	}
	over := 0
	var errs []error
	for _, c := range cands {
		acct, err := l.cfg.Catalog.Account(ctx, c.AccountID, raftmeta.LeaderRead())
		switch {
		case errors.Is(err, fsm.ErrAccountNotFound) || errors.Is(err, fsm.ErrNotFound):
			continue // usage of an account deleted since
		case err != nil:
			errs = append(errs, fmt.Errorf("account %s: %w", c.AccountID, err))
			continue
		}
		if acct.Tier != fsm.TierFree {
			if err := l.ensureCleared(ctx, c.AccountID, now); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		lr, lw := l.cfg.Free.RowsReadPerDay, l.cfg.Free.RowsWrittenPerDay
		if acct.Limits.RowsReadPerDay > 0 {
			lr = acct.Limits.RowsReadPerDay
		}
		if acct.Limits.RowsWrittenPerDay > 0 {
			lw = acct.Limits.RowsWrittenPerDay
		}
		n := Notice{AccountID: acct.ID, AccountName: acct.Name, Day: day, Until: end}
		switch {
		case lr > 0 && c.RowsRead > lr:
			n.Limit, n.Value, n.Threshold = ReasonRowsRead, c.RowsRead, lr
		case lw > 0 && c.RowsWritten > lw:
			n.Limit, n.Value, n.Threshold = ReasonRowsWritten, c.RowsWritten, lw
		default:
			continue // found by the floor, under its own limits
		}
		over++
		if err := l.limit(ctx, n, now); err != nil {
			errs = append(errs, err)
		}
	}
	l.m.passes.Inc()
	l.m.accountsOver.Set(float64(over))
	l.m.lastPass.Set(float64(time.Now().Unix()))
	l.stmu.Lock()
	l.status.Passes++
	l.status.LastPassUnix = time.Now().Unix()
	l.status.LastPassMs = time.Since(start).Milliseconds()
	l.status.AccountsOver = over
	l.status.LastError = ""
	if len(errs) > 0 {
		l.status.LastError = errors.Join(errs...).Error()
	}
	l.stmu.Unlock()
	return errors.Join(errs...)
}

// ensureCleared publishes a clear for a non-free account over the free
// thresholds unless this term's latest record for it already is one
// (a flag published before an upgrade that raced it, or by an earlier
// term).
func (l *Limiter) ensureCleared(ctx context.Context, account string, now time.Time) error {
	l.pubMu.Lock()
	s := l.state[account]
	done := s != nil && s.cleared
	l.pubMu.Unlock()
	if done {
		return nil
	}
	return l.publishClear(ctx, account, now)
}

// limit publishes the flag (once per term and day), then claims the day's
// notice in the catalog and queues it when the claim is ours. The flag
// goes first: refusing queries matters more than the mail.
func (l *Limiter) limit(ctx context.Context, n Notice, now time.Time) error {
	l.pubMu.Lock()
	s := l.entry(n.AccountID)
	if s.cleared || s.untilMs != n.Until.UnixMilli() {
		if err := l.publish(ctx, event.Limit{AccountID: n.AccountID, Reason: n.Limit, UntilMs: n.Until.UnixMilli(), Time: now.UnixMilli()}); err != nil {
			l.pubMu.Unlock()
			return err
		}
		l.m.limitsPublished.Inc()
		s.untilMs, s.cleared = n.Until.UnixMilli(), false
		l.log.Info("account limited", "account", n.AccountID, "limit", n.Limit, "value", n.Value, "threshold", n.Threshold, "until", n.Until)
	}
	claimed := s.noticeDay == n.Day
	l.pubMu.Unlock()
	if claimed {
		return nil
	}
	ok, by, err := l.claim(ctx, n)
	if err != nil {
		l.m.claims.WithLabelValues("error").Inc()
		return err // the next pass proposes the same claim again
	}
	l.pubMu.Lock()
	l.entry(n.AccountID).noticeDay = n.Day
	l.pubMu.Unlock()
	if !ok {
		l.m.claims.WithLabelValues("taken").Inc()
		l.log.Debug("notice already claimed", "account", n.AccountID, "day", n.Day, "by", by)
		return nil
	}
	l.m.claims.WithLabelValues("claimed").Inc()
	l.enqueue(n)
	return nil
}

// claim proposes claim_limit_notice. The RequestID is fixed per (account,
// day, holder): a retry after a lost answer is answered the original
// result, so this instance never mistakes its own claim for another's.
// It is a hash of the three (128 bits): the catalog caps IDs at 64 bytes.
func (l *Limiter) claim(ctx context.Context, n Notice) (bool, string, error) {
	body := fsm.ClaimLimitNotice{AccountID: n.AccountID, Day: n.Day, Holder: l.cfg.Holder}
	cmd, err := fsm.NewCommand(fsm.CmdClaimLimitNotice, fmt.Sprintf("limit-notice/%x", sha256.Sum256([]byte(n.AccountID+"/"+n.Day+"/"+l.cfg.Holder)))[:45], l.cfg.Now().UnixNano(), body)
	if err != nil {
		return false, "", err
	}
	res, err := l.cfg.Catalog.Apply(ctx, cmd)
	if err != nil {
		return false, "", fmt.Errorf("claim notice of %s for %s: %w", n.AccountID, n.Day, err)
	}
	if res.Err != nil {
		return false, "", fmt.Errorf("claim notice of %s for %s: %s", n.AccountID, n.Day, res.Err.Message)
	}
	var c fsm.LimitNoticeClaim
	if err := json.Unmarshal(res.Value, &c); err != nil {
		return false, "", fmt.Errorf("claim notice of %s: decode: %w", n.AccountID, err)
	}
	return c.Claimed, c.Holder, nil
}
