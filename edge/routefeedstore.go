package edge

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The route feed's positions live in the route cache's own bbolt file, in
// bucket "feed": one sub-bucket per topic holding the topic's Kafka ID
// ("id", 16 bytes) and, per partition, the next offset to read ("p" +
// big-endian partition → big-endian offset). A batch of feed records and
// the position after it are written in one transaction, so a restart
// resumes exactly after the last applied record: nothing applied is
// re-read, nothing stored is skipped.
var (
	feedBucket  = []byte("feed")
	feedIDKey   = []byte("id")
	feedPartKey = byte('p')
)

// feedEntry is one decoded record of the route feed. A tombstone (the
// record after a deleted route, kept by compaction when the deleted record
// is gone) carries only the UUID and the generation from its header.
type feedEntry struct {
	route     Route
	tombstone bool
}

func feedPartitionKey(p int32) []byte {
	k := []byte{feedPartKey, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(k[1:], uint32(p))
	return k
}

// feedPositions returns the stored topic ID (zero if none) and the next
// offset to read per partition.
func (c *RouteCache) feedPositions(topic string) ([16]byte, map[int32]int64, error) {
	var id [16]byte
	next := make(map[int32]int64)
	err := c.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(feedBucket).Bucket([]byte(topic))
		if tb == nil {
			return nil
		}
		if v := tb.Get(feedIDKey); len(v) == len(id) {
			copy(id[:], v)
		}
		return tb.ForEach(func(k, v []byte) error {
			if len(k) == 5 && k[0] == feedPartKey && len(v) == 8 {
				next[int32(binary.BigEndian.Uint32(k[1:]))] = int64(binary.BigEndian.Uint64(v))
			}
			return nil
		})
	})
	if err != nil {
		return id, nil, fmt.Errorf("route feed positions: %w", err)
	}
	return id, next, nil
}

// setFeedTopic records the topic's ID. When dropPositions is set (the topic
// was deleted and created again under the same name: its offsets start
// over) the stored positions are dropped too.
func (c *RouteCache) setFeedTopic(topic string, id [16]byte, dropPositions bool) error {
	err := c.db.Update(func(tx *bolt.Tx) error {
		fb := tx.Bucket(feedBucket)
		if dropPositions {
			if err := fb.DeleteBucket([]byte(topic)); err != nil && err != bolt.ErrBucketNotFound {
				return err
			}
		}
		tb, err := fb.CreateBucketIfNotExists([]byte(topic))
		if err != nil {
			return err
		}
		return tb.Put(feedIDKey, id[:])
	})
	if err != nil {
		return fmt.Errorf("route feed topic: %w", err)
	}
	return nil
}

// applyFeed stores the entries of one fetched batch of a partition through
// the cache's ordering rules (putTx: never a lower generation, never
// deleted → active) and the partition's next offset, in one transaction.
// It returns how many entries were stored and how many were stale (the
// cache already held a newer version).
//
// A tombstone deletes the cached route at the generation it names, keeping
// the cached route's other fields; a tombstone older than the cached route
// is stale. Without any cached route it leaves a bare deleted marker (the
// query path answers not found for it, like any deleted route).
func (c *RouteCache) applyFeed(topic string, partition int32, entries []feedEntry, next int64) (applied, stale int, err error) {
	var stored, hosts []string
	err = c.update(func(tx *bolt.Tx) error {
		applied, stale, stored, hosts = 0, 0, stored[:0], hosts[:0]
		b := tx.Bucket(routesBucket)
		for _, e := range entries {
			r := e.route
			if e.tombstone {
				if v := b.Get([]byte(r.DatabaseUUID)); v != nil {
					if cur, err := decodeRoute(v); err == nil {
						if cur.Generation > r.Generation {
							stale++
							continue
						}
						gen := r.Generation
						r = cur
						r.State, r.Generation = "deleted", gen
					}
				}
			}
			ok, err := c.putTx(b, r)
			if err != nil {
				return err
			}
			if ok {
				applied++
				stored = append(stored, r.DatabaseUUID)
				if r.HostAddress != "" {
					hosts = append(hosts, r.HostAddress)
				}
			} else {
				stale++
			}
		}
		tb, err := tx.Bucket(feedBucket).CreateBucketIfNotExists([]byte(topic))
		if err != nil {
			return err
		}
		return tb.Put(feedPartitionKey(partition), binary.BigEndian.AppendUint64(nil, uint64(next)))
	})
	uuids := make([]string, len(entries))
	for i, e := range entries {
		uuids[i] = e.route.DatabaseUUID
	}
	c.forget(false, uuids...)
	if err != nil {
		return 0, 0, fmt.Errorf("route feed apply: %w", err)
	}
	if len(stored) > 0 {
		c.mu.Lock()
		for _, u := range stored {
			delete(c.negative, u)
		}
		c.mu.Unlock()
	}
	for _, h := range hosts {
		_ = c.NoteHost(h) // best effort, as noteRouteHosts
	}
	return applied, stale, nil
}
