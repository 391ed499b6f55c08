package topology

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Proc is one `shoal … serve` process in its node's namespace and in its own
// process group, so it can be killed, stopped and continued the way an
// operator's tools do, and restarted with the same arguments (same data
// directory and addresses). Its output across restarts is kept (the last
// logLimit bytes) for the report. Safe for concurrent use.
type Proc struct {
	Name string
	node *Node
	bin  string
	args []string
	env  []string // added to the test's environment
	log  *Log

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProc starts bin args in node's namespace.
func StartProc(node *Node, name, bin string, args ...string) (*Proc, error) {
	return StartProcEnv(node, name, nil, bin, args...)
}

// StartProcEnv is StartProc with env added to the test's environment.
func StartProcEnv(node *Node, name string, env []string, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, node: node, bin: bin, args: args, env: env, log: &Log{}}
	return p, p.Start()
}

// Start starts the process (again). The kernel kills it if the test process
// dies without running its cleanups.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := p.node.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

// Node is the namespace the process runs in.
func (p *Proc) Node() *Node { return p.node }

// Signal sends sig to the process's group.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.log, "--- %s at %s ---\n", sig, time.Now().Format(time.StampMilli))
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// SignalLeader sends sig to the process alone, not its group (e.g. SIGUSR1
// to a pipeline node, whose clickhouse-server child must not get it).
func (p *Proc) SignalLeader(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.log, "--- %s (process only) at %s ---\n", sig, time.Now().Format(time.StampMilli))
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// Kill is kill -9 of the group; it returns when the process has exited. It
// also ends a stopped process.
func (p *Proc) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	select {
	case <-exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s did not exit on SIGKILL", p.Name)
	}
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Output is the process's output so far (its tail), across restarts.
func (p *Proc) Output() string { return p.log.String() }

// logLimit bounds the output kept per process.
const logLimit = 256 << 10

// Log keeps the last logLimit bytes written to it. Safe for concurrent use.
type Log struct {
	mu  sync.Mutex
	buf []byte
}

func (l *Log) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	if len(l.buf) > logLimit {
		l.buf = append([]byte(nil), l.buf[len(l.buf)-logLimit/2:]...)
	}
	return len(b), nil
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// Binary builds a command of this module once and hands out its path: the
// shoal binary (the zero value), or a test-only command such as the object
// store node (Pkg). Close removes the build.
type Binary struct {
	// Pkg is the package to build (default github.com/shoaldb/shoal/cmd/shoal).
	Pkg string

	once sync.Once
	dir  string
	path string
	err  error
}

// ShoalPkg is the package a zero Binary builds.
const ShoalPkg = "github.com/shoaldb/shoal/cmd/shoal"

// S3NodePkg is the suite's object store node (cmd/s3node).
const S3NodePkg = "github.com/shoaldb/shoal/test/robustness/cmd/s3node"

// Path returns a freshly built binary. For shoal, $SHOAL_TEST_BIN may name a
// prebuilt one instead (e.g. a baseline build, to show that a check fails on
// the code it is meant to catch). The build uses the process's environment,
// i.e. build.env's tags and CGO flags, so the cache is reused.
func (b *Binary) Path() (string, error) {
	b.once.Do(func() {
		pkg := b.Pkg
		if pkg == "" {
			pkg = ShoalPkg
		}
		if prebuilt := os.Getenv("SHOAL_TEST_BIN"); prebuilt != "" && pkg == ShoalPkg {
			if b.path, b.err = filepath.Abs(prebuilt); b.err == nil {
				_, b.err = os.Stat(b.path)
			}
			return
		}
		if b.dir, b.err = os.MkdirTemp("", "shoal-robustness-bin-"); b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, filepath.Base(pkg))
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %w: %s", pkg, err, out)
		}
	})
	return b.path, b.err
}

// Close removes the built binary.
func (b *Binary) Close() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
