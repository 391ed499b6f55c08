package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// errInvalidSize is wrapped by decodeSize for a record that is not a size
// the catalog would accept.
var errInvalidSize = errors.New("invalid size record")

// decodeSize decodes and validates one storage record. It refuses what the
// catalog would refuse (a whole SetDatabaseStats is refused for one bad
// stat), so one bad record costs itself, not its batch.
func decodeSize(value []byte) (event.Size, error) {
	var s event.Size
	if len(value) == 0 {
		return s, fmt.Errorf("%w: empty value", errInvalidSize)
	}
	// One decode, then the version check (event.Decode reads the header
	// first, a second pass over every record: a tenth of the consumer's
	// CPU at full rate). A newer record that does not even decode as a
	// Size is refused either way.
	if err := json.Unmarshal(value, &s); err != nil {
		return s, fmt.Errorf("%w: %v", errInvalidSize, err)
	}
	if s.V > event.Version {
		return s, fmt.Errorf("%w: v=%d", event.ErrNewerVersion, s.V)
	}
	switch {
	case !canonicalUUID(s.DatabaseUUID):
		return s, fmt.Errorf("%w: database uuid %.80q is not canonical lowercase", errInvalidSize, s.DatabaseUUID)
	case s.SizeBytes < 0 || s.SizeBytes > fsm.MaxDatabaseSizeBytes:
		return s, fmt.Errorf("%w: size %d out of range 0..%d", errInvalidSize, s.SizeBytes, int64(fsm.MaxDatabaseSizeBytes))
	case s.Seq < 0:
		return s, fmt.Errorf("%w: negative seq %d", errInvalidSize, s.Seq)
	}
	return s, nil
}

// canonicalUUID is the catalog's UUID rule: 36 bytes, dashes at 8, 13, 18
// and 23, lowercase hex elsewhere.
func canonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// batch is what one poll cycle hands to the catalog.
type batch struct {
	stats      []fsm.DatabaseStat // at most one per database, sorted by UUID
	invalid    int                // records skipped as not valid sizes
	superseded int                // sizes dropped for a newer one of the same database in this batch
	oldestMs   int64              // the oldest measurement time in the batch (Unix ms; 0: none)
}

// collapse turns records into one stat per database, keeping the highest
// Seq (on a tie the first in stream order, as the catalog would: a later
// equal seq is not greater). The stats are sorted by UUID: time-ordered
// v7 UUIDs then touch the catalog's B-trees in order.
func collapse(recs []*kgo.Record, onInvalid func(*kgo.Record, error)) batch {
	var b batch
	at := make(map[string]int, len(recs))
	for _, r := range recs {
		s, err := decodeSize(r.Value)
		if err != nil {
			b.invalid++
			if onInvalid != nil {
				onInvalid(r, err)
			}
			continue
		}
		t := s.Time
		if t <= 0 {
			t = r.Timestamp.UnixMilli()
		}
		if t > 0 && (b.oldestMs == 0 || t < b.oldestMs) {
			b.oldestMs = t
		}
		st := fsm.DatabaseStat{UUID: s.DatabaseUUID, SizeBytes: s.SizeBytes, Seq: s.Seq}
		if i, ok := at[st.UUID]; ok {
			b.superseded++
			if st.Seq > b.stats[i].Seq {
				b.stats[i] = st
			}
			continue
		}
		at[st.UUID] = len(b.stats)
		b.stats = append(b.stats, st)
	}
	slices.SortFunc(b.stats, func(x, y fsm.DatabaseStat) int { return strings.Compare(x.UUID, y.UUID) })
	return b
}
