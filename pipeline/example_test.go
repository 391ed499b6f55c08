package pipeline_test

import (
	"context"
	"log"
	"time"

	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/event"
)

// A service publishing usage: one Producer per process, a Sequencer whose
// producer ID survives restarts without repeating, and a UsageAggregator
// on the request path.
func Example() {
	const spillDir = "/var/lib/myservice/spill"
	ids, err := pipeline.OpenSequencer(spillDir, "myservice-host-7") // host ID + a new boot epoch
	if err != nil {
		log.Fatal(err)
	}
	p, err := pipeline.New(pipeline.Config{
		Brokers:  []string{"kafka-1:9092", "kafka-2:9092"},
		SpillDir: spillDir, // replays what a previous run left here
	})
	if err != nil {
		log.Fatal(err)
	}
	usage := pipeline.NewUsageAggregator(p, ids, pipeline.UsageConfig{Host: "myservice-host-7"})

	// On the request path: cheap, never blocks on Kafka.
	usage.Record("account-1", "0190f0a4-5d1c-7a2e-9b1f-2c3d4e5f6a7b", 0x5eed, "SELECT * FROM t WHERE id = ?",
		1, 0, 300*time.Microsecond, false)

	// Events built by hand carry their own identity too.
	_ = p.PublishUsage(event.Usage{V: event.Version, EventID: ids.Next(), AccountID: "account-1"})

	// Shutdown: aggregators first (their last window goes to the
	// producer), then the producer (what it cannot deliver in 5 s is
	// spilled for the next run).
	usage.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		log.Print(err)
	}
}
