package plane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/shoaldb/shoal/internal/config"
)

// selfSigned writes a CA-less self-signed certificate for 127.0.0.1 and
// returns the server's TLS config and the PEM file clients trust.
func selfSigned(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shoal-test-broker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, certPEM, 0o600))
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, ca
}

// TestKafkaSASLAndTLS: the connection settings reach a real
// Kafka-protocol broker over TCP that requires TLS and SCRAM-SHA-512: the
// right ones create the topics and report status; a wrong password, no
// TLS, or an untrusted CA fail with an error instead of hanging.
func TestKafkaSASLAndTLS(t *testing.T) {
	srvTLS, ca := selfSigned(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "shoal", "s3cret"), kfake.TLS(srvTLS))
	require.NoError(t, err)
	defer c.Close()
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	good, err := KafkaFromConfig(&config.Kafka{Brokers: c.ListenAddrs(), SASLMechanism: "scram-sha-512",
		SASLUser: "shoal", SASLPasswordFile: pw, TLS: true, TLSCAFile: ca})
	require.NoError(t, err)
	assert.Equal(t, "s3cret", good.SASLPassword, "the password file's trailing newline is not part of the password")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, EnsureTopics(ctx, good, discard()))
	rep, err := KafkaStatus(ctx, good)
	require.NoError(t, err)
	for _, tr := range rep.Topics {
		assert.Positive(t, tr.Partitions, tr.Name)
		assert.Empty(t, tr.Error, tr.Name)
	}

	for name, bad := range map[string]Kafka{
		"wrong password": func() Kafka { k := good; k.SASLPassword = "nope"; return k }(),
		"no TLS":         func() Kafka { k := good; k.TLS = false; return k }(),
		"untrusted CA":   func() Kafka { k := good; k.TLSCAFile = ""; return k }(),
	} {
		bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := KafkaStatus(bctx, bad)
		bcancel()
		assert.Error(t, err, name)
	}
}

func TestKafkaOptionsRefuseBadSettings(t *testing.T) {
	for name, k := range map[string]Kafka{
		"unknown mechanism": {Brokers: []string{"x:1"}, SASLMechanism: "gssapi", SASLUser: "u"},
		"SASL without user": {Brokers: []string{"x:1"}, SASLMechanism: "plain"},
		"missing CA file":   {Brokers: []string{"x:1"}, TLS: true, TLSCAFile: "/nonexistent/ca.pem"},
		"cert without key":  {Brokers: []string{"x:1"}, TLS: true, TLSCertFile: "/x.pem"},
	} {
		_, err := k.Options()
		assert.Error(t, err, name)
	}
	_, err := KafkaFromConfig(&config.Kafka{Brokers: []string{"x:1"}, SASLPasswordFile: "/nonexistent"})
	assert.Error(t, err)
}

func TestParseClickHouseDSN(t *testing.T) {
	ch, err := ParseClickHouseDSN("clickhouse://u:p@ch1:9000,ch2:9000/billing?dial_timeout=2s")
	require.NoError(t, err)
	assert.Equal(t, "billing", ch.Database)
	assert.Equal(t, []string{"ch1:9000", "ch2:9000"}, ch.Options.Addr)
	assert.Equal(t, "u", ch.Options.Auth.Username)
	assert.Empty(t, ch.Options.Auth.Database, "the connection starts in the server's default database")
	ch, err = ParseClickHouseDSN("clickhouse://ch1:9000")
	require.NoError(t, err)
	assert.Equal(t, "shoal", ch.Database)
	_, err = ParseClickHouseDSN("http://%zz")
	assert.Error(t, err)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
