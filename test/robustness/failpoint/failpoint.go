// Package failpoint is the robustness suite's enumerated faults. Each
// failpoint acts on a real process or a real link of the topology — kill -9
// and restart, SIGSTOP and SIGCONT, a node's bridge port taken down, its link
// delayed or throttled — for a set time, then heals, and reports when it
// started and ended on the history's clock so the report can lay faults and
// operations on one timeline.
package failpoint

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Kind enumerates the failpoints.
type Kind string

// The failpoints this package implements. The others (disk full,
// split brain 2/1, catalog cut off, route-cache purge storm, stopped usage
// consumer, lost create response, broker / ClickHouse / object store down)
// are not here yet: see test/robustness/README.md.
const (
	KillRestart   Kind = "kill-restart"   // kill -9, down for Duration, start with the same arguments
	StopCont      Kind = "stop-cont"      // SIGSTOP for Duration, then SIGCONT
	PartitionNode Kind = "partition-node" // the node's bridge port down for Duration: no packet in or out
	FollowerLag   Kind = "follower-lag"   // netem delay on the node's link, both ways, for Duration
	Throttle      Kind = "throttle"       // tbf bandwidth limit on the node's link, both ways, for Duration
)

// Kinds is every failpoint kind, in the order the README lists them.
func Kinds() []Kind { return []Kind{KillRestart, StopCont, PartitionNode, FollowerLag, Throttle} }

// Process is what KillRestart and StopCont need of a process
// (*topology.Proc provides it).
type Process interface {
	Kill() error
	Start() error
	Signal(syscall.Signal) error
}

// Link is what the network failpoints need of a node (*topology.Node
// provides it).
type Link interface {
	Isolate() error
	Rejoin() error
	Delay(d string) error
	Throttle(rate string) error
	Unshape() error
}

// Failpoint is one fault: what, on which target, for how long.
type Failpoint struct {
	Kind     Kind
	Target   string        // the member's name, for the timeline
	Duration time.Duration // how long the fault lasts before it heals
	Param    string        // FollowerLag: the delay ("200ms"); Throttle: the rate ("256kbit")

	proc Process
	link Link
}

// NewKillRestart: kill -9 of p, down for d, then restarted.
func NewKillRestart(name string, p Process, d time.Duration) Failpoint {
	return Failpoint{Kind: KillRestart, Target: name, Duration: d, proc: p}
}

// NewStopCont: p hangs (SIGSTOP) for d, then continues.
func NewStopCont(name string, p Process, d time.Duration) Failpoint {
	return Failpoint{Kind: StopCont, Target: name, Duration: d, proc: p}
}

// NewPartition: the node is cut off from every other for d.
func NewPartition(name string, l Link, d time.Duration) Failpoint {
	return Failpoint{Kind: PartitionNode, Target: name, Duration: d, link: l}
}

// NewFollowerLag: every packet to and from the node is delayed by delay for d.
func NewFollowerLag(name string, l Link, delay string, d time.Duration) Failpoint {
	return Failpoint{Kind: FollowerLag, Target: name, Duration: d, Param: delay, link: l}
}

// NewThrottle: the node's bandwidth is limited to rate both ways for d.
func NewThrottle(name string, l Link, rate string, d time.Duration) Failpoint {
	return Failpoint{Kind: Throttle, Target: name, Duration: d, Param: rate, link: l}
}

func (f Failpoint) String() string {
	s := fmt.Sprintf("%s(%s, %s", f.Kind, f.Target, f.Duration)
	if f.Param != "" {
		s += ", " + f.Param
	}
	return s + ")"
}

// Injection is one run of a failpoint on the history's clock.
type Injection struct {
	Failpoint Failpoint
	Start     time.Duration // fault in effect from here
	Healed    time.Duration // healed (restarted, continued, rejoined) here
	Err       error         // injecting or healing failed
}

// Run injects f, waits its Duration (or until ctx ends), heals it and
// returns the record. now is the history's clock. Healing runs even when ctx
// has ended: a fault is never left in place.
func (f Failpoint) Run(ctx context.Context, now func() time.Duration) Injection {
	inj := Injection{Failpoint: f, Start: now()}
	inject, heal := f.actions()
	if err := inject(); err != nil {
		inj.Err = fmt.Errorf("inject %s: %w", f, err)
		if f.Kind != KillRestart { // a failed kill leaves the process running: no second start
			_ = heal()
		}
		inj.Healed = now()
		return inj
	}
	select {
	case <-ctx.Done():
	case <-time.After(f.Duration):
	}
	if err := heal(); err != nil {
		inj.Err = fmt.Errorf("heal %s: %w", f, err)
	}
	inj.Healed = now()
	return inj
}

func (f Failpoint) actions() (inject, heal func() error) {
	none := func() error { return errors.New("failpoint has no target") }
	switch f.Kind {
	case KillRestart:
		if f.proc == nil {
			return none, func() error { return nil }
		}
		return f.proc.Kill, f.proc.Start
	case StopCont:
		if f.proc == nil {
			return none, func() error { return nil }
		}
		return func() error { return f.proc.Signal(syscall.SIGSTOP) }, func() error { return f.proc.Signal(syscall.SIGCONT) }
	}
	if f.link == nil {
		return none, func() error { return nil }
	}
	switch f.Kind {
	case PartitionNode:
		return f.link.Isolate, f.link.Rejoin
	case FollowerLag:
		return func() error { return f.link.Delay(f.Param) }, f.link.Unshape
	case Throttle:
		return func() error { return f.link.Throttle(f.Param) }, f.link.Unshape
	}
	return func() error { return fmt.Errorf("unknown failpoint kind %q", f.Kind) }, func() error { return nil }
}
