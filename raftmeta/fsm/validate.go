package fsm

import (
	"fmt"
	"unicode/utf8"
)

// Field limits enforced by Apply (and worth enforcing in the client before
// proposing). The commands' validation (cmd_*.go) is built from the checks
// below: IDs are non-empty and at most 64 bytes, UUIDs are canonical
// lowercase RFC 4122 text, names follow D1's rules (lowercase letters,
// digits, '-' and '_', 1..64 bytes).
const (
	maxIDBytes         = 64
	maxNameBytes       = 64
	maxTextBytes       = 256
	MaxStatsPerCommand = 10_000
	// MaxDatabaseSizeBytes bounds a reported size (1 TiB, a hundred times
	// D1's largest database) so that sums over an account's databases can
	// never overflow int64 in SQLite (SUM raises an error on overflow, which
	// would be a fatal apply failure on every replica).
	MaxDatabaseSizeBytes = 1 << 40
)

// Read replication modes (D1's read_replication.mode).
const (
	ReadReplicationAuto     = "auto"
	ReadReplicationDisabled = "disabled"
)

// Account tiers and host states.
const (
	TierFree          = "free"
	TierPaid          = "paid"
	HostStateActive   = "active"
	HostStateDraining = "draining"
	HostStateDown     = "down"
	// HostStateLost is set only by an operator (set_host_state, `shoal
	// cluster host lost`): the host is gone and its databases are being
	// (or were) relocated from the archive. A lost host's own registration
	// never clears it (register_host keeps it); only `shoal cluster host
	// readmit` does.
	HostStateLost = "lost"
)

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkText accepts valid UTF-8 without control characters, at most max bytes.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalid, field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s contains a control character", ErrInvalid, field)
		}
	}
	return nil
}

// checkID: IDs are non-empty, at most 64 bytes, printable.
func checkID(field, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, field)
	}
	return checkText(field, s, maxIDBytes)
}

// checkUUID accepts only canonical lowercase 8-4-4-4-12 hex text, so one
// database has exactly one spelling (the primary key compares bytes).
func checkUUID(s string) error {
	if len(s) != 36 {
		return fmt.Errorf("%w: uuid %.80q is not canonical", ErrInvalid, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return fmt.Errorf("%w: uuid %q is not canonical", ErrInvalid, s)
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return fmt.Errorf("%w: uuid %q is not canonical lowercase hex", ErrInvalid, s)
			}
		}
	}
	return nil
}

// checkName applies D1's database name rules: lowercase letters, digits, '-'
// and '_', 1..64 bytes.
func checkName(s string) error {
	if s == "" || len(s) > maxNameBytes {
		return fmt.Errorf("%w: database name must be 1..%d bytes, got %d", ErrInvalid, maxNameBytes, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: database name %q: only lowercase letters, digits, '-' and '_'", ErrInvalid, s)
		}
	}
	return nil
}

// checkHash accepts a lowercase hex SHA-256.
func checkHash(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("%w: token hash must be 64 hex characters", ErrInvalid)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: token hash must be lowercase hex", ErrInvalid)
		}
	}
	return nil
}

func checkTier(t string) error {
	if t != TierFree && t != TierPaid {
		return fmt.Errorf("%w: tier %.64q", ErrInvalid, t)
	}
	return nil
}

func checkHostState(s string) error {
	switch s {
	case HostStateActive, HostStateDraining, HostStateDown:
		return nil
	}
	return fmt.Errorf("%w: host state %.64q", ErrInvalid, s)
}

func checkReadReplication(m string) error {
	if m != ReadReplicationAuto && m != ReadReplicationDisabled {
		return fmt.Errorf("%w: read replication mode %.64q", ErrInvalid, m)
	}
	return nil
}

func checkLimits(l Limits) error {
	if l.MaxDatabases < 0 || l.MaxStorageBytes < 0 || l.MaxDatabaseBytes < 0 ||
		l.RowsReadPerDay < 0 || l.RowsWrittenPerDay < 0 || l.HeartbeatIntervalMs < -1 {
		return fmt.Errorf("%w: negative limit", ErrInvalid)
	}
	return nil
}
