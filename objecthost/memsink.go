package objecthost

import (
	"context"
	"sync"
)

// MemSink records every event in memory. It implements UsageSink, SizeSink
// and RouteSink for tests and for the single-process dev mode before the
// Kafka pipeline is wired. Safe for concurrent use.
type MemSink struct {
	mu       sync.Mutex
	usage    []UsageEvent
	sizes    []SizeEvent
	routes   []Route
	failNext int // PublishRoute fails this many more times (tests)
}

var (
	_ UsageSink = (*MemSink)(nil)
	_ SizeSink  = (*MemSink)(nil)
	_ RouteSink = (*MemSink)(nil)
)

// publishError is what a MemSink told to fail (FailRoutes) returns.
type publishError struct{}

func (publishError) Error() string { return "route publication failed" }

func (s *MemSink) RecordUsage(e UsageEvent) {
	s.mu.Lock()
	s.usage = append(s.usage, e)
	s.mu.Unlock()
}

func (s *MemSink) RecordSize(e SizeEvent) {
	s.mu.Lock()
	s.sizes = append(s.sizes, e)
	s.mu.Unlock()
}

func (s *MemSink) PublishRoute(_ context.Context, r Route) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext > 0 {
		s.failNext--
		return publishError{}
	}
	s.routes = append(s.routes, r)
	return nil
}

// FailRoutes makes the next n PublishRoute calls fail.
func (s *MemSink) FailRoutes(n int) {
	s.mu.Lock()
	s.failNext = n
	s.mu.Unlock()
}

// Usage returns a copy of the recorded usage events.
func (s *MemSink) Usage() []UsageEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]UsageEvent(nil), s.usage...)
}

// Sizes returns a copy of the recorded size events.
func (s *MemSink) Sizes() []SizeEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]SizeEvent(nil), s.sizes...)
}

// Routes returns a copy of the recorded route publications.
func (s *MemSink) Routes() []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Route(nil), s.routes...)
}

// LastRoute returns the latest publication for a database UUID.
func (s *MemSink) LastRoute(uuid string) (Route, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.routes) - 1; i >= 0; i-- {
		if s.routes[i].DatabaseUUID == uuid {
			return s.routes[i], true
		}
	}
	return Route{}, false
}
