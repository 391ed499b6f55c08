// Package plane wires the background plane (pipeline/) into the roles that
// run it: the object host's producer side (usage and size aggregators, the
// route publisher), the consumers of the pipeline role (storage consumer,
// ClickHouse sink, storage snapshotter), the embedded broker and the managed
// ClickHouse of `shoal dev`, and the Kafka connection settings (brokers,
// SASL, TLS) every one of them shares. cmd/shoal's `shoal dev`,
// `shoal objecthost serve`, `shoal edge serve` and `shoal pipeline serve`
// build on it, so each piece is started one way only.
package plane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/shoaldb/shoal/internal/config"
)

// Kafka is how a role reaches the brokers.
type Kafka struct {
	Brokers []string
	// SASLMechanism is "", "plain", "scram-sha-256" or "scram-sha-512".
	SASLMechanism, SASLUser, SASLPassword string
	// TLS enables TLS to the brokers; CAFile (default: the system pool),
	// CertFile+KeyFile (a client certificate) and ServerName are optional.
	TLS                                bool
	TLSCAFile, TLSCertFile, TLSKeyFile string
	TLSServerName                      string
}

// KafkaFromConfig is the kafka block of cluster.hcl (validated by
// config.Load), reading sasl_password_file when given.
func KafkaFromConfig(k *config.Kafka) (Kafka, error) {
	if k == nil {
		return Kafka{}, errors.New("cluster.hcl has no kafka block")
	}
	out := Kafka{Brokers: k.Brokers, SASLMechanism: k.SASLMechanism, SASLUser: k.SASLUser, SASLPassword: k.SASLPassword,
		TLS: k.TLS, TLSCAFile: k.TLSCAFile, TLSCertFile: k.TLSCertFile, TLSKeyFile: k.TLSKeyFile, TLSServerName: k.TLSServerName}
	if k.SASLPasswordFile != "" {
		b, err := os.ReadFile(k.SASLPasswordFile)
		if err != nil {
			return Kafka{}, fmt.Errorf("kafka sasl_password_file: %w", err)
		}
		out.SASLPassword = strings.TrimRight(string(b), "\r\n")
	}
	return out, nil
}

// Enabled reports whether brokers are configured.
func (k Kafka) Enabled() bool { return len(k.Brokers) > 0 }

// Options are the connection options every client of the plane appends to
// its own: SASL and TLS. Seed brokers are not included (each component sets
// them from Brokers).
func (k Kafka) Options() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.SASLMechanism != "" {
		m, err := k.mechanism()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	if k.TLS {
		cfg, err := k.tlsConfig()
		if err != nil {
			return nil, err
		}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}
		opts = append(opts, kgo.Dialer(d.DialContext))
	}
	return opts, nil
}

// Client is a Kafka client of the brokers with the connection options and
// extra.
func (k Kafka) Client(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := k.Options()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, opts...), extra...)...)
}

func (k Kafka) mechanism() (sasl.Mechanism, error) {
	if k.SASLUser == "" {
		return nil, errors.New("kafka: SASL needs a user")
	}
	switch k.SASLMechanism {
	case "plain":
		return plain.Auth{User: k.SASLUser, Pass: k.SASLPassword}.AsMechanism(), nil
	case "scram-sha-256":
		return scram.Auth{User: k.SASLUser, Pass: k.SASLPassword}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: k.SASLUser, Pass: k.SASLPassword}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafka: unknown SASL mechanism %q (plain, scram-sha-256 or scram-sha-512)", k.SASLMechanism)
}

func (k Kafka) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.TLSServerName}
	if k.TLSCAFile != "" {
		pem, err := os.ReadFile(k.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka tls_ca_file %s: no PEM certificate", k.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
		return nil, errors.New("kafka: tls_cert_file and tls_key_file go together")
	}
	if k.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
