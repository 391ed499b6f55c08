package validate

import (
	"fmt"
	"sort"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// ProducerSeqs is one usage producer's (a host boot epoch's) events as
// ClickHouse holds them.
type ProducerSeqs struct {
	Producer           string
	Min, Max, Distinct uint64
}

// AckedQueries counts, per database, the queries the client saw
// acknowledged: each ran exactly once on its host.
func AckedQueries(ops []traffic.Op) map[string]int64 {
	out := map[string]int64{}
	for _, op := range ops {
		switch op.Kind {
		case traffic.Insert, traffic.RegWrite, traffic.RegRead, traffic.BoundRead:
			if op.Outcome == traffic.OK {
				out[op.DB]++
			}
		}
	}
	return out
}

// UsageExact: the usage pipeline neither lost nor doubled events. Every
// producer's sequence numbers in ClickHouse are contiguous (the hosts
// number their events; a gap is an event lost between host and
// ClickHouse), and for every database the queries billed (requests FINAL:
// duplicates collapse) lie between those acknowledged to the client, each
// of which ran once, and those the client sent.
//
// The one loss pipeline/DESIGN.md accepts is what a host held in memory
// when it was killed -9: the open aggregation window (1 s) and records not
// yet handed to the broker. crashes lists, per database, the windows
// before each kill of its host; acknowledged queries that returned inside
// one may be missing, and only those.
func UsageExact(ops []traffic.Op, sent map[string]int, billed map[string]int64, producers []ProducerSeqs, crashes map[string][]Window) Result {
	r := Result{Check: "usage in ClickHouse exact: no producer gap, billed queries between acknowledged (less the killed hosts' last window) and sent"}
	excused := map[string]int64{}
	for _, op := range ops {
		switch op.Kind {
		case traffic.Insert, traffic.RegWrite, traffic.RegRead, traffic.BoundRead:
		default:
			continue
		}
		if op.Outcome != traffic.OK {
			continue
		}
		for _, w := range crashes[op.DB] {
			if op.Return >= w.From && op.Return <= w.To {
				excused[op.DB]++
				break
			}
		}
	}
	for _, p := range producers {
		r.Checked++
		if span := p.Max - p.Min + 1; span != p.Distinct {
			r.Violations = append(r.Violations, fmt.Sprintf("producer %s: seq %d..%d holds %d distinct events (%d missing)", p.Producer, p.Min, p.Max, p.Distinct, int64(span)-int64(p.Distinct)))
		}
	}
	for db, acked := range AckedQueries(ops) {
		r.Checked++
		got := billed[db]
		switch {
		case got < acked-excused[db]:
			r.Violations = append(r.Violations, fmt.Sprintf("database %s: %d queries billed, %d acknowledged (%d of them just before a kill of its host): usage lost", db, got, acked, excused[db]))
		case got > int64(sent[db]):
			r.Violations = append(r.Violations, fmt.Sprintf("database %s: %d queries billed, only %d sent (usage doubled)", db, got, sent[db]))
		}
	}
	sort.Strings(r.Violations)
	return r
}
