package pipeline

import "time"

// Clock is the time source of the aggregators: window bounds come from Now
// and windows close on the ticks of NewTicker. Tests inject a clock they
// move by hand.
type Clock interface {
	Now() time.Time
	NewTicker(d time.Duration) Ticker
}

// Ticker delivers ticks on C until Stop, like time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// NewTicker is time.NewTicker.
func (SystemClock) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTicker struct{ t *time.Ticker }

func (t systemTicker) C() <-chan time.Time { return t.t.C }
func (t systemTicker) Stop()               { t.t.Stop() }
