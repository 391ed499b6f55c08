package pki

import (
	"crypto/tls"
	"net"
)

func tlsListener(ln net.Listener, cfg *tls.Config) net.Listener { return tls.NewListener(ln, cfg) }

// parseIP is net.ParseIP (nil for a DNS name).
func parseIP(s string) net.IP { return net.ParseIP(s) }
