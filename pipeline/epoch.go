package pipeline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/shoaldb/shoal/pipeline/event"
)

// epochFile is the boot epoch's file inside the directory given to
// BootEpoch (by convention the producer's SpillDir).
const epochFile = "epoch"

// BootEpoch allocates the next boot epoch of whatever owns dir: it reads
// dir/epoch (0 when missing), writes the value plus one durably (temporary
// file, fsync, rename, directory fsync) and returns it. Call it once per
// process start, before emitting any event; a crash after BootEpoch
// returns only skips an epoch, so epochs — and with them event IDs — never
// repeat. dir is created if needed.
func BootEpoch(dir string) (uint64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("boot epoch: %w", err)
	}
	path := filepath.Join(dir, epochFile)
	var prev uint64
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		prev, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			// Never guess: a reused epoch would repeat event IDs.
			return 0, fmt.Errorf("boot epoch: %s is damaged (%q); remove it only if this host's producer ID changes too", path, raw)
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		return 0, fmt.Errorf("boot epoch: %w", err)
	}
	next := prev + 1
	if err := writeFileAtomic(path, []byte(strconv.FormatUint(next, 10)+"\n"), true); err != nil {
		return 0, fmt.Errorf("boot epoch: %w", err)
	}
	return next, nil
}

// ProducerID is the producer identity of one process lifetime of a host:
// "host@epoch". hostID must be unique in the cluster and stable for the
// host (its catalog host ID); epoch comes from BootEpoch.
func ProducerID(hostID string, epoch uint64) string {
	return hostID + "@" + strconv.FormatUint(epoch, 10)
}

// Sequencer hands out the event IDs of one producer identity: the same
// Producer string and sequences 1, 2, 3, … It is safe for concurrent use.
type Sequencer struct {
	producer string
	seq      atomic.Uint64
}

// NewSequencer returns a Sequencer for producer, which must not have been
// used before (see OpenSequencer).
func NewSequencer(producer string) *Sequencer { return &Sequencer{producer: producer} }

// OpenSequencer allocates a boot epoch in dir and returns the Sequencer of
// ProducerID(hostID, epoch): IDs unique across restarts of this host.
func OpenSequencer(dir, hostID string) (*Sequencer, error) {
	if hostID == "" {
		return nil, errors.New("pipeline: sequencer needs a host ID")
	}
	epoch, err := BootEpoch(dir)
	if err != nil {
		return nil, err
	}
	return NewSequencer(ProducerID(hostID, epoch)), nil
}

// Producer is the producer identity in the IDs.
func (s *Sequencer) Producer() string { return s.producer }

// Next returns a fresh event ID.
func (s *Sequencer) Next() event.ID { return event.ID{Producer: s.producer, Seq: s.seq.Add(1)} }
