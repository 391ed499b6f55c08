package limiter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/chlocal/chtest"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestMain(m *testing.M) { chtest.Main(m) }

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9_]`)

// openStore is a chsink.Store on a ClickHouse database of the test's own.
func openStore(t *testing.T) *chsink.Store {
	t.Helper()
	ch := chtest.Require(t)
	db := "lim_" + strings.ToLower(nonIdent.ReplaceAllString(t.Name(), "_"))
	st, err := chsink.Open(chsink.StoreConfig{Options: ch.Options(), Database: db, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	require.NoError(t, st.Conn().Exec(ctx, "DROP DATABASE IF EXISTS "+db))
	require.NoError(t, st.EnsureSchema(ctx))
	return st
}

var usageSeq struct {
	sync.Mutex
	n uint64
}

// addUsage inserts one usage row for account at t into ClickHouse.
func addUsage(t *testing.T, st *chsink.Store, account string, at time.Time, read, written int64) {
	t.Helper()
	usageSeq.Lock()
	usageSeq.n++
	seq := usageSeq.n
	usageSeq.Unlock()
	ms := at.UnixMilli()
	require.NoError(t, st.Insert(context.Background(), []event.Usage{{V: 1, EventID: event.ID{Producer: "test", Seq: seq},
		Host: "h1", AccountID: account, DatabaseUUID: "db-" + account, WindowStart: ms, WindowEnd: ms + 1000,
		Queries: 1, RowsRead: read, RowsWritten: written}}))
}

// startCatalog is one real raftmeta node over loopback and a client.
func startCatalog(t *testing.T) *raftmeta.Client {
	t.Helper()
	n, err := raftmeta.NewNode(raftmeta.Config{ID: "n0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, DrainInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	require.Eventually(t, n.IsLeader, 15*time.Second, 20*time.Millisecond, "the node never led")
	cl, err := raftmeta.NewClient([]string{n.HTTPAddr()}, raftmeta.WithCacheTTL(0))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func createAccount(t *testing.T, cl *raftmeta.Client, id, name, tier string) {
	t.Helper()
	l := fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 5 << 30, MaxDatabaseBytes: 500 << 20}
	if tier == fsm.TierFree {
		l.RowsReadPerDay, l.RowsWrittenPerDay = 5_000_000, 100_000
	}
	_, err := cl.CreateAccount(context.Background(), fsm.CreateAccount{ID: id, Name: name, Tier: tier, Limits: l})
	require.NoError(t, err)
}

// startBroker is the embedded Kafka-protocol broker over TCP with the
// plane's topics.
func startBroker(t *testing.T) plane.Kafka {
	t.Helper()
	b, err := broker.Start(broker.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	k := plane.Kafka{Brokers: []string{b.Addr()}}
	cl, err := k.Client()
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, pipeline.EnsureTopics(ctx, cl, pipeline.DefaultTopics()...))
	return k
}

// limitsLog reads the whole `limits` topic as it grows.
type limitsLog struct {
	mu   sync.Mutex
	recs []event.Limit
	at   []time.Time // when each record was seen
	cl   *kgo.Client
	done chan struct{}
}

func watchLimits(t *testing.T, k plane.Kafka) *limitsLog {
	t.Helper()
	cl, err := k.Client(kgo.ConsumeTopics(event.TopicLimits), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	w := &limitsLog{cl: cl, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(w.done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			for _, r := range fs.Records() {
				var l event.Limit
				if err := event.Decode(r.Value, &l); err == nil {
					w.mu.Lock()
					w.recs = append(w.recs, l)
					w.at = append(w.at, time.Now())
					w.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done; cl.Close() })
	return w
}

// of is every record for account so far.
func (w *limitsLog) of(account string) []event.Limit {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []event.Limit
	for _, l := range w.recs {
		if l.AccountID == account {
			out = append(out, l)
		}
	}
	return out
}

// latest is account's latest record and when it was seen.
func (w *limitsLog) latest(account string) (event.Limit, time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.recs) - 1; i >= 0; i-- {
		if w.recs[i].AccountID == account {
			return w.recs[i], w.at[i], true
		}
	}
	return event.Limit{}, time.Time{}, false
}

// mailbox is a real SMTP server (go-smtp) recording every message.
type mailbox struct {
	mu   sync.Mutex
	msgs []mail
	srv  *gosmtp.Server
	addr string
	fail int // refuse this many DATA commands with a 451 first
}

type mail struct {
	from string
	to   []string
	data string
}

type mailSession struct {
	mb  *mailbox
	cur mail
}

func (s *mailSession) Reset()        { s.cur = mail{} }
func (s *mailSession) Logout() error { return nil }
func (s *mailSession) Mail(from string, _ *gosmtp.MailOptions) error {
	s.cur.from = from
	return nil
}
func (s *mailSession) Rcpt(to string, _ *gosmtp.RcptOptions) error {
	s.cur.to = append(s.cur.to, to)
	return nil
}
func (s *mailSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.mb.mu.Lock()
	defer s.mb.mu.Unlock()
	if s.mb.fail > 0 {
		s.mb.fail--
		return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	}
	s.cur.data = string(b)
	s.mb.msgs = append(s.mb.msgs, s.cur)
	return nil
}

type mailBackend struct{ mb *mailbox }

func (b mailBackend) NewSession(*gosmtp.Conn) (gosmtp.Session, error) {
	return &mailSession{mb: b.mb}, nil
}

func startMailbox(t *testing.T) *mailbox {
	t.Helper()
	mb := &mailbox{}
	mb.srv = gosmtp.NewServer(mailBackend{mb})
	mb.srv.Domain = "localhost"
	mb.srv.ReadTimeout, mb.srv.WriteTimeout = 10*time.Second, 10*time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mb.addr = ln.Addr().String()
	go func() { _ = mb.srv.Serve(ln) }()
	t.Cleanup(func() { _ = mb.srv.Close() })
	return mb
}

// to is every message for rcpt.
func (mb *mailbox) to(rcpt string) []mail {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	var out []mail
	for _, m := range mb.msgs {
		for _, r := range m.to {
			if r == rcpt {
				out = append(out, m)
			}
		}
	}
	return out
}

// hook is an httptest webhook receiver checking signatures.
type hook struct {
	mu       sync.Mutex
	payloads []WebhookPayload
	badSigs  int
	srv      *httptest.Server
	fail     int // answer 503 to this many requests first
}

const hookSecret = "s3cret"

func startHook(t *testing.T) *hook {
	t.Helper()
	h := &hook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if r.Header.Get(SignatureHeader) != Sign(hookSecret, body) {
			h.badSigs++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if h.fail > 0 {
			h.fail--
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		var p WebhookPayload
		if err := jsonUnmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.Header.Get(NoticeIDHeader) != p.NoticeID {
			http.Error(w, "notice id header", http.StatusBadRequest)
			return
		}
		h.payloads = append(h.payloads, p)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) of(account string) []WebhookPayload {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []WebhookPayload
	for _, p := range h.payloads {
		if p.AccountID == account {
			out = append(out, p)
		}
	}
	return out
}

// clock is an injectable wall clock: real time plus an offset.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// env is one test's plane: ClickHouse, broker, catalog, mail, webhook.
type env struct {
	st    *chsink.Store
	k     plane.Kafka
	cat   *raftmeta.Client
	mb    *mailbox
	hk    *hook
	limit *limitsLog
	clk   *clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{st: openStore(t), k: startBroker(t), cat: startCatalog(t), mb: startMailbox(t), hk: startHook(t), clk: &clock{}}
	e.limit = watchLimits(t, e.k)
	return e
}

// start runs a limiter of the env (closed at cleanup unless closed before).
func (e *env) start(t *testing.T, name string, mod func(*Config)) *Limiter {
	t.Helper()
	cfg := Config{Kafka: e.k, Store: e.st, Catalog: e.cat, Interval: 200 * time.Millisecond, Now: e.clk.Now,
		Holder: fmt.Sprintf("%s-%d", name, time.Now().UnixNano()), SessionTimeout: 6 * time.Second,
		NoticeRetryMin: 50 * time.Millisecond, NoticeRetryMax: 500 * time.Millisecond,
		Notify: NotifyConfig{
			SMTP:    &SMTPConfig{Addr: e.mb.addr, From: "limits@shoal.test", To: "owner+{account_id}@example.com", Timeout: 5 * time.Second},
			Webhook: &WebhookConfig{URL: e.hk.srv.URL, Secret: hookSecret, Backoff: 20 * time.Millisecond},
		},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if mod != nil {
		mod(&cfg)
	}
	l, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// publishTier writes an accounts event, as the admin API does.
func publishTier(t *testing.T, k plane.Kafka, account, tier string) {
	t.Helper()
	cl, err := k.Client()
	require.NoError(t, err)
	defer cl.Close()
	b, err := event.Encode(event.Account{V: 1, EventID: event.ID{Producer: "test-admin", Seq: uint64(time.Now().UnixNano())},
		AccountID: account, Tier: tier, Time: time.Now().UnixMilli()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: event.TopicAccounts, Key: []byte(account), Value: b}).FirstErr())
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
