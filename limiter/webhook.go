package limiter

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Webhook headers.
const (
	// SignatureHeader carries "sha256=" + hex(HMAC-SHA256(secret, body)).
	SignatureHeader = "X-Shoal-Signature"
	// NoticeIDHeader carries Notice.ID(): the same on every delivery of
	// one notice, for the receiver to drop duplicates.
	NoticeIDHeader = "X-Shoal-Notice-Id"
)

// WebhookConfig configures the HTTP webhook notifier.
type WebhookConfig struct {
	URL string
	// Secret signs every body (SignatureHeader). Empty: no signature.
	Secret string
	// Attempts within one Send (default 3), with Backoff (default 200 ms)
	// doubling between them. The limiter retries failed Sends later.
	Attempts int
	Backoff  time.Duration
	// Timeout of one request (default 10 s).
	Timeout time.Duration
	Client  *http.Client // default: a client with Timeout
}

// WebhookPayload is the JSON body the webhook POSTs.
type WebhookPayload struct {
	NoticeID    string `json:"notice_id"`
	AccountID   string `json:"account_id"`
	AccountName string `json:"account_name,omitempty"`
	Limit       string `json:"limit"`
	Value       int64  `json:"value"`
	Threshold   int64  `json:"threshold"`
	Day         string `json:"day"`
	Until       string `json:"until"` // RFC 3339, UTC
}

// Webhook POSTs notices as JSON. A 2xx answer is success; 4xx other than
// 408 and 429 is final (retrying an identical request cannot help) and
// returned at once; anything else is retried.
type Webhook struct{ cfg WebhookConfig }

// NewWebhook checks cfg and fills its defaults.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.URL == "" {
		return nil, errors.New("limiter: webhook needs a URL")
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 3
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 200 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	return &Webhook{cfg: cfg}, nil
}

// Name is "webhook".
func (w *Webhook) Name() string { return "webhook" }

// Sign is the SignatureHeader value of body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Send POSTs n, retrying within cfg.Attempts.
func (w *Webhook) Send(ctx context.Context, n Notice) error {
	body, err := json.Marshal(WebhookPayload{NoticeID: n.ID(), AccountID: n.AccountID, AccountName: n.AccountName,
		Limit: n.Limit, Value: n.Value, Threshold: n.Threshold, Day: n.Day, Until: n.Until.UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	wait := w.cfg.Backoff
	for attempt := 1; ; attempt++ {
		err = w.post(ctx, n, body)
		if err == nil || errors.Is(err, ErrPermanent) || attempt >= w.cfg.Attempts {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (w *Webhook) post(ctx context.Context, n Notice, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook: %w: %w", ErrPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(NoticeIDHeader, n.ID())
	if w.cfg.Secret != "" {
		req.Header.Set(SignatureHeader, Sign(w.cfg.Secret, body))
	}
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooManyRequests:
		return fmt.Errorf("webhook: %w: %s: %s", ErrPermanent, resp.Status, bytes.TrimSpace(msg))
	default:
		return fmt.Errorf("webhook: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
}
