package plane

import (
	"context"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/pipeline/storage"
)

// KafkaReport is the brokers' view of the plane: each topic's partitions
// and retained records, and each consumer group's state, members and lag.
type KafkaReport struct {
	Brokers []string      `json:"brokers"`
	Topics  []TopicReport `json:"topics"`
	Groups  []GroupReport `json:"groups"`
}

// TopicReport is one topic of pipeline.DefaultTopics.
type TopicReport struct {
	Name       string `json:"name"`
	Partitions int    `json:"partitions"`
	Records    int64  `json:"records"` // end minus start offsets, all partitions
	Error      string `json:"error,omitempty"`
}

// GroupReport is one consumer group of the pipeline role.
type GroupReport struct {
	Group   string `json:"group"`
	Topic   string `json:"topic"`
	State   string `json:"state"`
	Members int    `json:"members"`
	Lag     int64  `json:"lag"` // records between the committed offsets and the end, all partitions
	Error   string `json:"error,omitempty"`
}

// Groups are the pipeline role's consumer groups and their topics.
var Groups = []struct{ Group, Topic string }{
	{storage.DefaultGroup, event.TopicStorage},
	{chsink.DefaultGroup, event.TopicUsage},
}

// KafkaStatus asks the brokers (bounded by ctx).
func KafkaStatus(ctx context.Context, k Kafka) (KafkaReport, error) {
	cl, err := k.Client()
	if err != nil {
		return KafkaReport{}, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	rep := KafkaReport{Brokers: k.Brokers}
	var names []string
	for _, t := range pipeline.DefaultTopics() {
		names = append(names, t.Name)
	}
	starts, err := adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return rep, fmt.Errorf("brokers %v: %w", k.Brokers, err)
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return rep, fmt.Errorf("brokers %v: %w", k.Brokers, err)
	}
	for _, name := range names {
		tr := TopicReport{Name: name}
		for p, end := range ends[name] {
			if end.Err != nil {
				tr.Error = end.Err.Error()
				continue
			}
			tr.Partitions++
			if st, ok := starts.Lookup(name, p); ok && st.Err == nil {
				tr.Records += end.Offset - st.Offset
			}
		}
		if tr.Partitions == 0 && tr.Error == "" {
			tr.Error = "topic does not exist"
		}
		rep.Topics = append(rep.Topics, tr)
	}
	groups := make([]string, len(Groups))
	for i, g := range Groups {
		groups[i] = g.Group
	}
	lags, err := adm.Lag(ctx, groups...)
	if err != nil {
		return rep, fmt.Errorf("brokers %v: consumer groups: %w", k.Brokers, err)
	}
	for _, g := range Groups {
		gr := GroupReport{Group: g.Group, Topic: g.Topic}
		l, ok := lags[g.Group]
		switch {
		case !ok:
			gr.State = "unknown"
		default:
			gr.State, gr.Members = l.State, len(l.Members)
			if e := l.Error(); e != nil {
				gr.Error = e.Error()
			}
			gr.Lag = l.Lag.TotalByTopic()[g.Topic].Lag
			if l.Lag.IsEmpty() && gr.Error == "" {
				// No commit yet: everything retained is pending.
				for _, t := range rep.Topics {
					if t.Name == g.Topic {
						gr.Lag = t.Records
					}
				}
			}
		}
		rep.Groups = append(rep.Groups, gr)
	}
	sort.Slice(rep.Groups, func(i, j int) bool { return rep.Groups[i].Group < rep.Groups[j].Group })
	return rep, nil
}
