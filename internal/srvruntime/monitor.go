package srvruntime

import (
	"os"
	"runtime"
	"strings"
)

// The runtime's monitor thread (sysmon) parks in a deep sleep whenever it
// finds every P idle, and the next goroutine to enter a system call or a
// cgo call then wakes it (a futex wake-up), after which it polls every
// 20 µs again for about a millisecond before slowing down. A role that
// goes idle between requests — the edge on a loaded machine, between
// queries, many times a millisecond — pays that wake-up and the monitor's
// short sleeps over and over: in the deploy benchmark's profile of the
// edge at 16 clients, 3.5% of its CPU was the wake-up alone, and its
// system calls per query included 0.4 nanosleeps (the monitor's); in an
// object host's, where every SQLite call enters the runtime's system-call
// state too, the wake-up was 11%.
//
// With GODEBUG's schedtrace set the monitor never parks (runtime/proc.go,
// sysmon: the deep sleep is skipped when schedtrace > 0); it keeps its
// normal back-off instead, at most one wake-up every 10 ms when idle.
// MonitorAwake sets schedtrace to its largest period, about 24.8 days, so
// the trace itself is all but never printed: one line on stderr when the
// machine has been up longer than that, then one per period.

// monitorAwake is the GODEBUG setting MonitorAwake adds.
const monitorAwake = "schedtrace=2147483647"

// MonitorAwake re-executes the running binary (the same file, through
// /proc/self/exe; same PID, arguments and environment) with monitorAwake
// added to GODEBUG, unless GODEBUG already sets schedtrace (an operator's
// choice, e.g. GODEBUG=schedtrace=0 to opt out; and the re-executed
// process, which therefore does not do it again). Call it first thing in
// a serve command, before anything is opened or started: the runtime reads
// GODEBUG's schedtrace only at start. It returns only when it did not
// re-execute: with nil when there was nothing to do, else with the error
// of the exec (the role then runs without it). On systems other than
// Linux it does nothing.
func MonitorAwake() error {
	if runtime.GOOS != "linux" {
		return nil
	}
	env, ok := monitorEnv(os.Environ())
	if !ok {
		return nil
	}
	return reexec(env)
}

// monitorEnv returns a copy of env with monitorAwake added to GODEBUG
// (ok), or ok false when GODEBUG already sets schedtrace. Only the first
// GODEBUG entry counts, as for the runtime's own lookup.
func monitorEnv(env []string) (out []string, ok bool) {
	out = append(make([]string, 0, len(env)+1), env...)
	for i, kv := range out {
		v, isGODEBUG := strings.CutPrefix(kv, "GODEBUG=")
		if !isGODEBUG {
			continue
		}
		for _, setting := range strings.Split(v, ",") {
			if k, _, _ := strings.Cut(setting, "="); strings.TrimSpace(k) == "schedtrace" {
				return nil, false
			}
		}
		if v == "" {
			out[i] = "GODEBUG=" + monitorAwake
		} else {
			out[i] = kv + "," + monitorAwake
		}
		return out, true
	}
	return append(out, "GODEBUG="+monitorAwake), true
}
