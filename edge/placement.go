package edge

import (
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// noJurisdictionError is a create in a jurisdiction that no registered
// object host serves: a request that cannot succeed until an operator adds
// such a host, so it is refused as the client's (400/7400, no Retry-After)
// rather than answered "please retry". A jurisdiction whose hosts are all
// down or draining is different — they may come back — and stays
// ErrUnavailable (503 with Retry-After). A jurisdiction is a legal
// constraint, so the create never falls back to another one.
type noJurisdictionError struct {
	jurisdiction string
	served       []string // jurisdictions the cluster serves ("" = none)
}

func (e *noJurisdictionError) Error() string {
	served := "none"
	if len(e.served) > 0 {
		served = strings.Join(e.served, ", ")
	}
	return fmt.Sprintf("Invalid property: jurisdiction => no object host of this deployment serves jurisdiction %q (jurisdictions served: %s); create the database without a jurisdiction or ask the operator to add a host in %q",
		e.jurisdiction, served, e.jurisdiction)
}

// As lets writeErr answer it like the other invalid properties.
func (e *noJurisdictionError) As(target any) bool {
	if v, ok := target.(**validationError); ok {
		*v = &validationError{status: http.StatusBadRequest, code: 7400, msg: e.Error()}
		return true
	}
	return false
}

// noHostInJurisdiction explains why no active host of jurisdiction was
// found among the active hosts: none registered at all (final, the
// client's), or registered but not active now (transient, retry). With no
// host registered anywhere the cluster is starting or empty: transient.
func (s *Server) noHostInJurisdiction(jurisdiction string, active []fsm.Host) error {
	s.hostsMu.Lock()
	registered, known := s.hostsJurs[jurisdiction], len(s.hostsJurs) > 0
	var served []string
	for j := range s.hostsJurs {
		if j != "" {
			served = append(served, j)
		}
	}
	s.hostsMu.Unlock()
	if registered || (!known && len(active) == 0) {
		return fmt.Errorf("%w: no active object host in jurisdiction %s", ErrUnavailable, jurisdiction)
	}
	sort.Strings(served)
	return &noJurisdictionError{jurisdiction: jurisdiction, served: served}
}
