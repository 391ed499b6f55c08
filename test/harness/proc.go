package harness

import (
	"bytes"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Proc is one `shoal …` child in its own process group, so a test can kill
// -9, stop and continue it the way an operator's tools do, and restart it
// with the same arguments (same data directory and addresses). Its output,
// across restarts, accumulates in Log and is printed if the test fails.
//
// A Proc belongs to the test that started it. Start and Restart replace Cmd
// and Exited and may fail the test, so they run on the test's goroutine and
// never concurrently with each other or with Signal.
type Proc struct {
	Name string
	Bin  string
	// Args are what Start runs Bin with; a test may change them while the
	// process is down (e.g. restart a host without --kafka-brokers).
	Args []string
	// Log holds stdout and stderr of every run, with the lines Restart adds.
	Log *SyncWriter
	// Cmd is the current run, replaced by each Start.
	Cmd *exec.Cmd
	// Exited is closed when the current run has exited (and been waited for).
	Exited <-chan struct{}
}

// StartProc starts bin with args as the child called name (in messages and
// logs). When the test ends the child is killed with SIGKILL (which also ends
// a SIGSTOPped one) and waited for; if the test failed, the tail of its
// output is logged.
func StartProc(t testing.TB, bin, name string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Bin: bin, Args: args, Log: &SyncWriter{}}
	p.Start(t)
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL) // also ends a SIGSTOPped process
		select {
		case <-p.Exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) did not exit on SIGKILL", p.Name, p.Cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("--- %s output (tail):\n%s", p.Name, Tail(p.Log.String(), 3000))
		}
	})
	return p
}

// Start runs Bin with Args in a new process group (ChildProcAttr), its
// output appended to Log. The previous run, if any, must have exited.
func (p *Proc) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	cmd.SysProcAttr = ChildProcAttr()
	require.NoError(t, cmd.Start(), "start %s", p.Name)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.Cmd, p.Exited = cmd, exited
}

// Signal sends sig to the process's group.
func (p *Proc) Signal(sig syscall.Signal) { _ = syscall.Kill(-p.Cmd.Process.Pid, sig) }

// Restart is kill -9, down, then a Start with the same arguments. It returns
// once the new run has started, not once it is ready.
func (p *Proc) Restart(t testing.TB, down time.Duration) {
	t.Helper()
	p.Signal(syscall.SIGKILL)
	<-p.Exited
	fmt.Fprintf(p.Log, "--- kill -9 at %s, restart after %s ---\n", time.Now().Format(time.TimeOnly), down)
	time.Sleep(down)
	p.Start(t)
}

// SyncWriter guards a buffer written by a child process pipe and read by
// the test. The zero value is ready to use; it is safe for concurrent use.
type SyncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (w *SyncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns everything written so far.
func (w *SyncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Tail is the last n bytes of s, marked with a leading "…" when cut.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
