// Package failpoint is the robustness suite's enumerated faults. Each
// failpoint acts on real processes, links or disks of the topology — kill -9
// and restart, SIGSTOP and SIGCONT, a node's bridge port taken down, packet
// filters splitting the network, a link delayed or throttled, a host's disk
// filled, the edges' route caches purged over and over, create answers lost
// after the checkpoint, the object store (the hosts' history archive) down —
// for a set time, then heals, and reports when it
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

// The failpoints this package implements (test/robustness/README.md,
// "Failpoints", says how each acts).
const (
	KillRestart   Kind = "kill-restart"    // kill -9, down for Duration, start with the same arguments
	StopCont      Kind = "stop-cont"       // SIGSTOP for Duration, then SIGCONT
	PartitionNode Kind = "partition-node"  // the node's bridge port down for Duration: no packet in or out
	SplitBrain    Kind = "split-brain"     // packet filters split the nodes into groups (e.g. catalog 2/1)
	OneWay        Kind = "one-way"         // one node stops receiving from another; the reverse still flows
	CatalogCutOff Kind = "catalog-cut-off" // every catalog node's port down: the central catalog is gone
	FollowerLag   Kind = "follower-lag"    // a follower's raft traffic delayed (netem, or a delaying relay where netem is missing)
	PacketLoss    Kind = "packet-loss"     // a share of the node's packets dropped, both ways (iptables statistic)
	Throttle      Kind = "throttle"        // tbf bandwidth limit on the node's link, both ways, for Duration
	DiskFull      Kind = "disk-full"       // an object host's (tmpfs) disk filled to the last byte
	RoutePurge    Kind = "route-purge"     // every edge's route cache purged again and again: a routing-miss storm
	LostCreate    Kind = "lost-create"     // edges drop create answers after the catalog write (and fail some after init)
	// ConsumerStopped: the pipeline node's consumers (storage consumer and
	// ClickHouse sink) stop polling while the broker keeps serving.
	ConsumerStopped Kind = "consumer-stopped"
	// ObjectStoreDown: the S3-protocol store the hosts archive into is
	// gone for Duration — killed -9 (restarted on its data), stopped
	// (requests hang) or cut off (silence); Param says which.
	ObjectStoreDown Kind = "object-store-down"
	// ObjectStoreFaulty: the store is up but answers every request 503
	// SlowDown, or answers each one late; Param says which.
	ObjectStoreFaulty Kind = "object-store-faulty"
	// ObjectStoreLoses: the store loses objects it acknowledged — a few of
	// the hosts' archived segments and snapshots deleted or overwritten
	// with a byte changed behind their back (cmd/s3node's mode=lose); the
	// loss is permanent, the hosts' scrubbers must find and heal it.
	ObjectStoreLoses Kind = "object-store-loses"
	// CatalogRestore: the catalog backed up (`shoal cluster backup`) at
	// the injection, traffic for Duration, then the whole catalog restored
	// from that older backup (`shoal cluster restore`) at the heal: an
	// operator rewinding the catalog.
	CatalogRestore Kind = "catalog-restore"
)

// Ways the object store goes down (ObjectStoreDown's Param).
const (
	StoreKilled  = "kill -9"
	StoreStopped = "SIGSTOP"
	StoreCut     = "link down"
)

// Ways the object store misbehaves while up (ObjectStoreFaulty's Param).
const (
	StoreErrors = "503 SlowDown"
	StoreSlow   = "slow"
)

// Kinds is every failpoint kind, in the order the README lists them.
func Kinds() []Kind {
	return []Kind{KillRestart, StopCont, PartitionNode, SplitBrain, OneWay, CatalogCutOff, FollowerLag, PacketLoss, Throttle, DiskFull, RoutePurge, LostCreate,
		ConsumerStopped, ObjectStoreDown, ObjectStoreFaulty, ObjectStoreLoses, CatalogRestore}
}

// Process is what KillRestart and StopCont need of a process
// (*topology.Proc provides it).
type Process interface {
	Kill() error
	Start() error
	Signal(syscall.Signal) error
}

// Link is what the single-node network failpoints need of a node
// (*topology.Node provides it).
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
	Target   string        // the member(s), for the timeline
	Duration time.Duration // how long the fault lasts before it heals
	Param    string        // e.g. FollowerLag's delay, Throttle's rate, SplitBrain's groups

	inject, heal func() error
	// during, if set, runs while the fault is in effect (after inject,
	// before heal) until its context ends: RoutePurge's repeated purges.
	during func(ctx context.Context)
	// noHealOnFailedInject: a failed kill leaves the process running, so
	// it gets no second start; every other failed inject is healed.
	noHealOnFailedInject bool
}

// Custom builds a failpoint from its actions (the kinds whose targets are
// wider than one process or link, or need more than Link offers:
// SplitBrain, CatalogCutOff, DiskFull, RoutePurge, LostCreate, PacketLoss,
// FollowerLag by relay, ConsumerStopped, ObjectStoreFaulty, with the
// actions topology provides).
func Custom(kind Kind, target, param string, d time.Duration, inject, heal func() error) Failpoint {
	return Failpoint{Kind: kind, Target: target, Param: param, Duration: d, inject: inject, heal: heal}
}

// WithDuring returns f with fn running from the injection to the heal.
func (f Failpoint) WithDuring(fn func(ctx context.Context)) Failpoint {
	f.during = fn
	return f
}

// NewKillRestart: kill -9 of p, down for d, then restarted. whileDown, if
// set, runs once p has exited and before it starts again (e.g. integrity
// checks of the files it left).
func NewKillRestart(name string, p Process, d time.Duration, whileDown func()) Failpoint {
	return Failpoint{Kind: KillRestart, Target: name, Duration: d, noHealOnFailedInject: true,
		inject: func() error {
			if err := p.Kill(); err != nil {
				return err
			}
			if whileDown != nil {
				whileDown()
			}
			return nil
		},
		heal: p.Start}
}

// NewStopCont: p hangs (SIGSTOP) for d, then continues.
func NewStopCont(name string, p Process, d time.Duration) Failpoint {
	return Failpoint{Kind: StopCont, Target: name, Duration: d,
		inject: func() error { return p.Signal(syscall.SIGSTOP) },
		heal:   func() error { return p.Signal(syscall.SIGCONT) }}
}

// NewPartition: the node is cut off from every other for d.
func NewPartition(name string, l Link, d time.Duration) Failpoint {
	return Failpoint{Kind: PartitionNode, Target: name, Duration: d, inject: l.Isolate, heal: l.Rejoin}
}

// NewFollowerLag: every packet to and from the node is delayed by delay for d.
func NewFollowerLag(name string, l Link, delay string, d time.Duration) Failpoint {
	return Failpoint{Kind: FollowerLag, Target: name, Duration: d, Param: delay,
		inject: func() error { return l.Delay(delay) }, heal: l.Unshape}
}

// NewThrottle: the node's bandwidth is limited to rate both ways for d.
func NewThrottle(name string, l Link, rate string, d time.Duration) Failpoint {
	return Failpoint{Kind: Throttle, Target: name, Duration: d, Param: rate,
		inject: func() error { return l.Throttle(rate) }, heal: l.Unshape}
}

// NewObjectStoreDown: the object store (process p on link l) is down for d
// in the way mode names: StoreKilled (kill -9, then started again on the
// same data: a store that crashed and recovered), StoreStopped (SIGSTOP:
// requests hang until SIGCONT) or StoreCut (its link down: nothing in or
// out, connections go silent).
func NewObjectStoreDown(name, mode string, p Process, l Link, d time.Duration) Failpoint {
	f := Failpoint{Kind: ObjectStoreDown, Target: name, Duration: d, Param: mode}
	switch mode {
	case StoreKilled:
		f.inject, f.heal, f.noHealOnFailedInject = p.Kill, p.Start, true
	case StoreStopped:
		f.inject = func() error { return p.Signal(syscall.SIGSTOP) }
		f.heal = func() error { return p.Signal(syscall.SIGCONT) }
	case StoreCut:
		f.inject, f.heal = l.Isolate, l.Rejoin
	}
	return f
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
	Start     time.Duration // injection begun here (the fault may take effect up to Effective)
	Healed    time.Duration // healed (restarted, continued, rejoined) here
	// Effective is when the injection returned: the fault is surely in
	// effect from here to HealStart (when healing began). Start–Healed
	// bounds the fault from outside (what may have been affected),
	// Effective–HealStart from inside (what was surely affected).
	Effective, HealStart time.Duration
	Err                  error // injecting or healing failed
}

// Run injects f, waits its Duration (or until ctx ends), heals it and
// returns the record. now is the history's clock. Healing runs even when ctx
// has ended: a fault is never left in place.
func (f Failpoint) Run(ctx context.Context, now func() time.Duration) Injection {
	inj := Injection{Failpoint: f, Start: now()}
	if f.inject == nil || f.heal == nil {
		inj.Err = errors.New("failpoint has no actions")
		inj.Healed = now()
		return inj
	}
	if err := f.inject(); err != nil {
		inj.Err = fmt.Errorf("inject %s: %w", f, err)
		if !f.noHealOnFailedInject {
			_ = f.heal()
		}
		inj.Healed = now()
		return inj
	}
	inj.Effective = now()
	wait, cancel := context.WithTimeout(ctx, f.Duration)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if f.during != nil {
			f.during(wait)
		}
		<-wait.Done()
	}()
	<-done
	cancel()
	inj.HealStart = now()
	if err := f.heal(); err != nil {
		inj.Err = fmt.Errorf("heal %s: %w", f, err)
	}
	inj.Healed = now()
	return inj
}
