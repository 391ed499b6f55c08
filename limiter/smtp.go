package limiter

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/smtp"
	"net/textproto"
	"strings"
	"time"
)

// SMTPConfig configures the mail notifier.
type SMTPConfig struct {
	Addr string // host:port of the submission server
	From string // envelope and header sender
	// To is the recipient template: "{account_id}" and "{account_name}"
	// are replaced. Accounts have no e-mail field in the catalog, so
	// either the account name is an address ("{account_name}", the
	// default) or the operator maps IDs to a mailbox
	// ("limits+{account_id}@example.com").
	To string
	// Username and Password enable AUTH PLAIN (net/smtp only sends them
	// over TLS or to localhost).
	Username, Password string
	// StartTLS requires STARTTLS before anything else is sent; TLSConfig
	// (default: verify against the system pool, ServerName the Addr's
	// host) is used for it.
	StartTLS  bool
	TLSConfig *tls.Config
	// Timeout bounds one delivery (default 30 s).
	Timeout time.Duration
	Now     func() time.Time // the Date header
}

// SMTP mails notices with net/smtp.
type SMTP struct {
	cfg  SMTPConfig
	host string
}

// NewSMTP checks cfg and fills its defaults.
func NewSMTP(cfg SMTPConfig) (*SMTP, error) {
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("limiter: smtp address %q: %w", cfg.Addr, err)
	}
	if cfg.From == "" {
		return nil, errors.New("limiter: smtp needs a from address")
	}
	if cfg.To == "" {
		cfg.To = "{account_name}"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &SMTP{cfg: cfg, host: host}, nil
}

// Name is "smtp".
func (s *SMTP) Name() string { return "smtp" }

// Recipient is the address n is mailed to.
func (s *SMTP) Recipient(n Notice) string {
	return strings.NewReplacer("{account_id}", n.AccountID, "{account_name}", n.AccountName).Replace(s.cfg.To)
}

// Send delivers one message: EHLO, STARTTLS (when configured), AUTH (when
// configured), MAIL, RCPT, DATA, QUIT.
func (s *SMTP) Send(ctx context.Context, n Notice) error {
	to := s.Recipient(n)
	if !strings.Contains(to, "@") || strings.ContainsAny(to, "\r\n<> ") {
		return fmt.Errorf("smtp: %w: recipient %q of account %s is not an address (set the recipient template)", ErrPermanent, to, n.AccountID)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("smtp: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("smtp: %w", err)
	}
	defer c.Close()
	if err := s.deliver(c, to, n); err != nil {
		return fmt.Errorf("smtp %s: %w", s.cfg.Addr, err)
	}
	return nil
}

func (s *SMTP) deliver(c *smtp.Client, to string, n Notice) error {
	if err := c.Hello("localhost"); err != nil {
		return err
	}
	if s.cfg.StartTLS {
		if ok, _ := c.Extension("STARTTLS"); !ok {
			return errors.New("server does not offer STARTTLS")
		}
		tc := s.cfg.TLSConfig
		if tc == nil {
			tc = &tls.Config{ServerName: s.host, MinVersion: tls.VersionTLS12}
		}
		if err := c.StartTLS(tc); err != nil {
			return err
		}
	}
	if s.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, s.host)); err != nil {
			return err
		}
	}
	if err := c.Mail(s.cfg.From); err != nil {
		return err
	}
	if err := c.Rcpt(to); err != nil {
		var pe *textproto.Error
		if errors.As(err, &pe) && pe.Code >= 500 {
			return fmt.Errorf("%w: %w", ErrPermanent, err)
		}
		return err
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(s.message(to, n)); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

// limitText names a limit for people.
func limitText(limit string) string {
	switch limit {
	case ReasonRowsRead:
		return "rows read per day"
	case ReasonRowsWritten:
		return "rows written per day"
	}
	return limit
}

// message is the RFC 5322 message: CRLF lines, a Message-ID derived from
// the notice (so mail systems can fold a duplicate), plain text.
func (s *SMTP) message(to string, n Notice) []byte {
	var b bytes.Buffer
	until := n.Until.UTC().Format("2006-01-02 15:04 MST")
	fmt.Fprintf(&b, "From: %s\r\n", s.cfg.From)
	fmt.Fprintf(&b, "To: %s\r\n", to)
	fmt.Fprintf(&b, "Subject: Shoal: daily limit of %s reached for account %s\r\n", limitText(n.Limit), n.AccountID)
	fmt.Fprintf(&b, "Date: %s\r\n", s.cfg.Now().UTC().Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: <limit.%s.%s@shoal>\r\n", strings.NewReplacer("/", ".", "@", ".").Replace(n.AccountID), n.Day)
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
	fmt.Fprintf(&b, "Your account %s", n.AccountID)
	if n.AccountName != "" && n.AccountName != n.AccountID {
		fmt.Fprintf(&b, " (%s)", n.AccountName)
	}
	fmt.Fprintf(&b, " has used %d %s today (%s UTC); the free tier allows %d.\r\n\r\n", n.Value, limitText(n.Limit), n.Day, n.Threshold)
	fmt.Fprintf(&b, "Queries to its databases fail until the limit lifts at %s (00:00 UTC),\r\nor until the account moves to the paid tier.\r\n", until)
	return b.Bytes()
}
