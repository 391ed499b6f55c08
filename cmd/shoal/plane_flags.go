package main

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/plane"
)

// kafkaFlags are the Kafka connection flags every role of the background
// plane takes (object hosts produce, edges read the route feed, the
// pipeline role consumes). With --config the kafka block of cluster.hcl
// is the default; flags given explicitly win.
type kafkaFlags struct {
	brokers                []string
	saslMechanism          string
	saslUser, saslPassFile string
	tls                    bool
	tlsCA                  string
}

func (k *kafkaFlags) register(f *pflag.FlagSet) {
	f.StringSliceVar(&k.brokers, "kafka-brokers", nil, "Kafka seed brokers (HOST:PORT[,…]) of the background plane; none: the plane is off for this role")
	f.StringVar(&k.saslMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512")
	f.StringVar(&k.saslUser, "kafka-sasl-user", "", "SASL user")
	f.StringVar(&k.saslPassFile, "kafka-sasl-password-file", "", "file holding the SASL password (default $SHOAL_KAFKA_SASL_PASSWORD)")
	f.BoolVar(&k.tls, "kafka-tls", false, "TLS to the brokers")
	f.StringVar(&k.tlsCA, "kafka-tls-ca", "", "CA bundle (PEM) for the brokers' certificates (default: the system pool)")
}

// resolve is the connection: cluster.hcl's kafka block (c may be nil)
// overridden by the flags that were set.
func (k *kafkaFlags) resolve(c *config.Cluster, set func(string) bool) (plane.Kafka, error) {
	var out plane.Kafka
	if c != nil && c.Kafka != nil {
		var err error
		if out, err = plane.KafkaFromConfig(c.Kafka); err != nil {
			return plane.Kafka{}, err
		}
	}
	if set("kafka-brokers") {
		out.Brokers = k.brokers
	}
	if set("kafka-sasl-mechanism") {
		out.SASLMechanism = k.saslMechanism
	}
	if set("kafka-sasl-user") {
		out.SASLUser = k.saslUser
	}
	if set("kafka-sasl-password-file") {
		b, err := os.ReadFile(k.saslPassFile)
		if err != nil {
			return plane.Kafka{}, err
		}
		out.SASLPassword = strings.TrimRight(string(b), "\r\n")
	} else if p := os.Getenv("SHOAL_KAFKA_SASL_PASSWORD"); p != "" && out.SASLPassword == "" {
		out.SASLPassword = p
	}
	if set("kafka-tls") {
		out.TLS = k.tls
	}
	if set("kafka-tls-ca") {
		out.TLSCAFile = k.tlsCA
	}
	return out, nil
}
