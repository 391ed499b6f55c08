package harness

import (
	"sort"
	"sync"
	"time"
)

// Latencies collects per-operation durations from many goroutines. The zero
// value is ready to use. Add is safe for concurrent use; Pct and Len are
// for after the load has stopped.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one operation's duration.
func (l *Latencies) Add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

// Pct is the p-quantile (0.5: the median, 1: the slowest) of the recorded
// durations, 0 when there are none. It sorts them in place.
func (l *Latencies) Pct(p float64) time.Duration {
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	if len(l.d) == 0 {
		return 0
	}
	return l.d[min(len(l.d)-1, int(float64(len(l.d))*p))]
}

// All returns the recorded durations (not a copy), for after the load has
// stopped.
func (l *Latencies) All() []time.Duration { return l.d }

// Len is the number of recorded operations.
func (l *Latencies) Len() int { return len(l.d) }

// Millis is d in milliseconds, for printing with a fixed precision.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Concurrently calls fn(0) … fn(n-1) from `workers` goroutines and returns
// when every call has.
func Concurrently(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
