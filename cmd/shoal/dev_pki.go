package main

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/shoaldb/shoal/internal/pki"
)

// devPKI is shoal dev's cluster CA and one certificate per component, in
// DIR/pki (the CA's key in DIR/pki/ca): the in-process catalog nodes, object
// host, edge, pipeline and limiter authenticate each other with mutual TLS
// over loopback exactly as a cluster's processes do, each with its own role,
// and the operator certificate is for `shoal cluster …` against dev.
type devPKI struct {
	dir string
	ca  string // the CA bundle
}

// devComponents are the certificates shoal dev issues: name → roles.
var devComponents = map[string][]string{
	"host": {pki.RoleHost}, "edge": {pki.RoleEdge}, "pipeline": {pki.RolePipeline},
	"limiter": {pki.RoleLimiter}, "operator": {pki.RoleOperator},
}

// openDevPKI creates what is missing (the CA once; a certificate per
// component and catalog node) and returns the set.
func openDevPKI(dir string, catalogNodes int) (*devPKI, error) {
	p := &devPKI{dir: filepath.Join(dir, "pki")}
	caDir := filepath.Join(p.dir, "ca")
	if _, err := os.Stat(filepath.Join(caDir, "ca.crt")); errors.Is(err, os.ErrNotExist) {
		if _, err := pki.InitCA(caDir, "shoal dev CA", 10*365*24*time.Hour); err != nil {
			return nil, err
		}
	}
	want := map[string][]string{}
	for k, v := range devComponents {
		want[k] = v
	}
	for i := 1; i <= catalogNodes; i++ {
		want["c"+itoa(i)] = []string{pki.RoleCatalog}
	}
	for name, roles := range want {
		if _, err := os.Stat(filepath.Join(p.dir, name+".crt")); err == nil {
			continue
		}
		if _, err := pki.Issue(caDir, p.dir, pki.IssueRequest{Node: name, Roles: roles, Validity: 10 * 365 * 24 * time.Hour,
			Hosts: []string{"127.0.0.1", "localhost"}}, true); err != nil {
			return nil, err
		}
	}
	p.ca = filepath.Join(p.dir, "ca.crt")
	return p, nil
}

// loader is the credentials of component name.
func (p *devPKI) loader(name string) (*pki.Loader, error) {
	return pki.NewLoader(p.files(name))
}

func (p *devPKI) files(name string) pki.Files {
	return pki.Files{CA: p.ca, Cert: filepath.Join(p.dir, name+".crt"), Key: filepath.Join(p.dir, name+".key")}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
