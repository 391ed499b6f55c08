package srvruntime

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMonitorEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want []string // nil: no re-exec
	}{
		{"no GODEBUG", []string{"A=1", "B=2"}, []string{"A=1", "B=2", "GODEBUG=" + monitorAwake}},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + monitorAwake, "A=1"}},
		{"other settings kept", []string{"A=1", "GODEBUG=http2client=0,netdns=go"}, []string{"A=1", "GODEBUG=http2client=0,netdns=go," + monitorAwake}},
		{"operator's schedtrace wins", []string{"GODEBUG=schedtrace=0"}, nil},
		{"schedtrace among others", []string{"GODEBUG=netdns=go,schedtrace=1000,scheddetail=1"}, nil},
		{"already re-executed", []string{"GODEBUG=" + monitorAwake}, nil},
		{"only the first GODEBUG counts", []string{"GODEBUG=netdns=go", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=netdns=go," + monitorAwake, "GODEBUG=schedtrace=0"}},
		{"a name that merely contains it", []string{"GODEBUG=xschedtrace=1"}, []string{"GODEBUG=xschedtrace=1," + monitorAwake}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]string(nil), tc.in...)
			got, ok := monitorEnv(in)
			assert.Equal(t, tc.in, in, "the caller's slice is not modified")
			if tc.want == nil {
				assert.False(t, ok)
				assert.Nil(t, got)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestMonitorAwakeReexecutes runs this test binary as a child that calls
// MonitorAwake: the child must come back with the setting in its
// environment, re-executed exactly once (same arguments), and a child
// whose GODEBUG already sets schedtrace must not re-execute.
func TestMonitorAwakeReexecutes(t *testing.T) {
	if os.Getenv("SRVRUNTIME_MONITOR_CHILD") == "1" {
		// The child: report what it runs with, then re-execute (or not).
		os.Stdout.WriteString("run GODEBUG=" + os.Getenv("GODEBUG") + "\n")
		if err := MonitorAwake(); err != nil {
			os.Stdout.WriteString("exec failed: " + err.Error() + "\n")
		}
		return
	}
	if _, err := os.Stat("/proc/self/exe"); err != nil {
		t.Skip("no /proc/self/exe")
	}
	run := func(godebug string) []string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMonitorAwakeReexecutes$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SRVRUNTIME_MONITOR_CHILD=1", "GODEBUG="+godebug)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		var runs []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "run ") || strings.HasPrefix(line, "exec failed") {
				runs = append(runs, line)
			}
		}
		return runs
	}
	// The parent's own environment may carry a GODEBUG; the child's is
	// set explicitly (the last entry of a duplicated name wins in
	// exec.Cmd's Env).
	assert.Equal(t, []string{"run GODEBUG=netdns=go", "run GODEBUG=netdns=go," + monitorAwake}, run("netdns=go"),
		"re-executed once, with the setting added")
	assert.Equal(t, []string{"run GODEBUG=schedtrace=0"}, run("schedtrace=0"), "an operator's schedtrace is left alone")
}
