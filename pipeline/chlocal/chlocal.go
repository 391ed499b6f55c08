// Package chlocal runs a local clickhouse-server as a child process on
// loopback, with its own data directory and a generated minimal
// configuration: the ClickHouse of `shoal dev` and of the background
// plane's tests. Production never uses it; cluster.hcl names a ClickHouse
// DSN instead.
//
// The server binary is Debian's clickhouse-server package (18.16 on
// bookworm; see ../../shared/dependencies.md for what clickhouse-go v2.51
// can and cannot do against it). When the binary is missing, Start returns
// an error wrapping ErrNotInstalled so a caller can say in one line that
// analytics are off and carry on.
//
// Process hygiene: the child runs in its own process group (Close signals
// the group), and on Linux it gets SIGKILL when the thread that started it
// dies (Pdeathsig; the starting goroutine keeps its OS thread locked for
// the child's lifetime so that "thread" means "this process"). A Server
// that is never closed therefore does not outlive the parent.
package chlocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Errors Start returns (wrapped with detail).
var (
	// ErrNotInstalled: no clickhouse-server binary was found.
	ErrNotInstalled = errors.New("clickhouse-server not installed")
	// ErrExited: the server exited before it answered a ping.
	ErrExited = errors.New("clickhouse-server exited during start")
)

// Config configures a local server. Zero values take the documented
// defaults.
type Config struct {
	// Binary is the server executable (default: "clickhouse-server" looked
	// up on PATH, then /usr/sbin/clickhouse-server, /usr/bin/clickhouse
	// with the "server" argument).
	Binary string
	// DataDir holds everything the server writes: data/, tmp/, log/ and
	// the generated config.xml and users.xml (required). Starting again on
	// the same DataDir keeps the databases.
	DataDir string
	// TCPPort is the native-protocol port on 127.0.0.1 (0: a free port,
	// read it back with Server.Addr). HTTPPort likewise (the HTTP port
	// only serves health checks and clickhouse-client's HTTP mode; the Go
	// driver speaks native).
	TCPPort  int
	HTTPPort int
	// StartTimeout bounds the wait for the first successful ping
	// (default 30 s; the server is usually ready in ~0.2 s).
	StartTimeout time.Duration
	// StopTimeout is how long Close waits after SIGTERM before it kills
	// the process group (default 15 s; 18.16 exits in ~2 s).
	StopTimeout time.Duration
	// MarkCacheBytes and UncompressedCacheBytes size the server's caches
	// (default 256 MiB each; the server refuses to start without
	// mark_cache_size).
	MarkCacheBytes         int64
	UncompressedCacheBytes int64
	// MaxMemoryUsage bounds one query's memory (default 2 GiB).
	MaxMemoryUsage int64
	// LogLevel is the server log level written to DataDir/log (default
	// "warning").
	LogLevel string
	// Logger receives this package's own messages (default: discarded).
	Logger *slog.Logger
}

// Server is a running clickhouse-server child process. Close stops it;
// Close returns once the process has exited.
type Server struct {
	cfg      Config
	tcpPort  int
	httpPort int
	cmd      *exec.Cmd
	pgid     int
	exited   chan struct{} // closed when the child has been reaped
	waitErr  error         // valid after exited is closed
	stderr   *tailBuffer
	lock     *os.File // flock on DataDir/chlocal.lock, released after the child exits
	closeErr error
	once     sync.Once
}

// Start writes the configuration under cfg.DataDir, starts the server and
// waits until it answers a ping over the native protocol. Ports left 0 are
// chosen free; if a chosen port is taken between choosing and binding
// (another process won the race), Start tries again with new ports.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("chlocal: DataDir is required")
	}
	cfg.setDefaults()
	argv, err := findBinary(cfg.Binary)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("chlocal: data dir: %w", err)
	}
	cfg.DataDir = dir
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("chlocal: %w", err)
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	autoPorts := cfg.TCPPort == 0 || cfg.HTTPPort == 0
	const attempts = 3
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, cfg, argv)
		if err == nil {
			s.lock = lock
			return s, nil
		}
		if !autoPorts || attempt == attempts || !errors.Is(err, errAddrInUse) {
			lock.Close()
			return nil, err
		}
		cfg.Logger.Warn("clickhouse port taken, retrying with new ports", "err", err)
	}
}

var errAddrInUse = errors.New("address already in use")

func (c *Config) setDefaults() {
	if c.StartTimeout <= 0 {
		c.StartTimeout = 30 * time.Second
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 15 * time.Second
	}
	if c.MarkCacheBytes <= 0 {
		c.MarkCacheBytes = 256 << 20
	}
	if c.UncompressedCacheBytes <= 0 {
		c.UncompressedCacheBytes = 256 << 20
	}
	if c.MaxMemoryUsage <= 0 {
		c.MaxMemoryUsage = 2 << 30
	}
	if c.LogLevel == "" {
		c.LogLevel = "warning"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func start(ctx context.Context, cfg Config, argv []string) (*Server, error) {
	tcpPort, httpPort := cfg.TCPPort, cfg.HTTPPort
	var err error
	if tcpPort == 0 {
		if tcpPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if httpPort == 0 {
		for httpPort == 0 || httpPort == tcpPort {
			if httpPort, err = freePort(); err != nil {
				return nil, err
			}
		}
	}
	confPath := filepath.Join(cfg.DataDir, "config.xml")
	if err := writeConfig(cfg, tcpPort, httpPort); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		tcpPort:  tcpPort,
		httpPort: httpPort,
		exited:   make(chan struct{}),
		stderr:   &tailBuffer{max: 8 << 10},
	}
	args := append(argv[1:len(argv):len(argv)], "--config-file="+confPath)
	s.cmd = exec.Command(argv[0], args...)
	s.cmd.Dir = cfg.DataDir
	s.cmd.Stdout = s.stderr
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = sysProcAttr()
	s.cmd.WaitDelay = 5 * time.Second // output pipes held open by a stray grandchild

	// The goroutine that starts the child keeps its OS thread locked
	// until the child is reaped: Pdeathsig fires when the *thread* that
	// forked exits, and a locked thread is never reused or retired by the
	// runtime while the lock is held.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("chlocal: start %s: %w", argv[0], err)
	}
	s.pgid = s.cmd.Process.Pid // Setpgid with Pgid 0: the group is the child's pid
	cfg.Logger.Info("clickhouse-server started", "pid", s.pgid, "tcp", s.Addr(), "dir", cfg.DataDir)

	if err := s.waitReady(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// waitReady pings over the native protocol until it answers, the child
// exits, ctx ends or StartTimeout passes.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	var last error
	for {
		select {
		case <-s.exited:
			detail := s.failureDetail()
			if strings.Contains(detail, "Address already in use") {
				return fmt.Errorf("chlocal: %w: %w: %s", ErrExited, errAddrInUse, detail)
			}
			return fmt.Errorf("chlocal: %w (%v): %s", ErrExited, s.waitErr, detail)
		default:
		}
		if last = s.ping(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chlocal: clickhouse-server not ready after %s: %w (last ping: %v)", s.cfg.StartTimeout, ctx.Err(), last)
		case <-s.exited:
		case <-time.After(backoff):
		}
		if backoff < 200*time.Millisecond {
			backoff *= 2
		}
	}
}

func (s *Server) ping(ctx context.Context) error {
	conn, err := clickhouse.Open(s.Options())
	if err != nil {
		return err
	}
	defer conn.Close()
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return conn.Ping(pctx)
}

// failureDetail is one line saying why the server stopped: the last error
// line of its stderr or error log, else the last line it printed.
func (s *Server) failureDetail() string {
	out := s.stderr.String()
	if b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, "log", "clickhouse-server.err.log")); err == nil {
		if len(b) > 8<<10 {
			b = b[len(b)-8<<10:]
		}
		out += "\n" + string(b)
	}
	var last, lastErr string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		last = line
		if i := strings.Index(line, "<Error> "); i >= 0 {
			lastErr = line[i+len("<Error> "):]
		}
	}
	switch {
	case lastErr != "":
		return lastErr
	case last != "":
		return last
	}
	return "(no output)"
}

// Addr is the native-protocol address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tcpPort)) }

// HTTPAddr is the HTTP interface address, "127.0.0.1:port".
func (s *Server) HTTPAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpPort)) }

// TCPPort and HTTPPort are the ports the server listens on; pass them in a
// new Config to restart it where clients expect it.
func (s *Server) TCPPort() int  { return s.tcpPort }
func (s *Server) HTTPPort() int { return s.httpPort }

// DSN is a clickhouse-go DSN for the default user and database over the
// native protocol.
func (s *Server) DSN() string { return "clickhouse://default:@" + s.Addr() + "/default" }

// Options are clickhouse-go options for this server (native protocol,
// default user, uncompressed).
func (s *Server) Options() *clickhouse.Options {
	return &clickhouse.Options{
		Addr:        []string{s.Addr()},
		Protocol:    clickhouse.Native,
		Auth:        clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: time.Second,
		// No wire compression: on loopback LZ4 only costs CPU on both ends
		// (inserts measured faster here without it).
		Compression: &clickhouse.Compression{Method: clickhouse.CompressionNone},
	}
}

// Pid is the server's process ID.
func (s *Server) Pid() int { return s.pgid }

// Exited is closed when the server process has exited (for whatever
// reason).
func (s *Server) Exited() <-chan struct{} { return s.exited }

// Close sends SIGTERM to the server's process group and waits for it to
// exit; after StopTimeout it sends SIGKILL and waits again. It returns nil
// when the server exited on SIGTERM (whatever its exit status), and is
// safe to call more than once.
func (s *Server) Close() error {
	s.once.Do(func() { s.closeErr = s.stop(syscall.SIGTERM, s.cfg.StopTimeout); s.unlock() })
	return s.closeErr
}

// Kill sends SIGKILL to the server's process group and waits for it: a
// crash, for fault tests. Later Close calls return nil.
func (s *Server) Kill() error {
	s.once.Do(func() { s.closeErr = s.stop(syscall.SIGKILL, 0); s.unlock() })
	return s.closeErr
}

func (s *Server) stop(sig syscall.Signal, grace time.Duration) error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = syscall.Kill(-s.pgid, sig)
	if sig != syscall.SIGKILL {
		select {
		case <-s.exited:
			s.cfg.Logger.Info("clickhouse-server stopped", "pid", s.pgid)
			return nil
		case <-time.After(grace):
		}
		s.cfg.Logger.Warn("clickhouse-server did not stop in time, killing", "pid", s.pgid, "after", grace)
		_ = syscall.Kill(-s.pgid, syscall.SIGKILL)
		<-s.exited
		return fmt.Errorf("chlocal: clickhouse-server did not exit within %s of SIGTERM; killed", grace)
	}
	<-s.exited
	return nil
}

func (s *Server) unlock() {
	if s.lock != nil {
		s.lock.Close()
	}
}

// ErrDataDirInUse: another Server (in this or another process) owns the
// data directory.
var ErrDataDirInUse = errors.New("clickhouse data dir in use")

// lockDir takes an exclusive flock on dir/chlocal.lock before anything in
// dir is rewritten, so a second Start on a live server's directory fails
// without touching that server's config files. The lock dies with the
// process.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "chlocal.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chlocal: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("chlocal: %w: %s: %w", ErrDataDirInUse, dir, err)
	}
	return f, nil
}

// findBinary returns the argv prefix that runs the server.
func findBinary(bin string) ([]string, error) {
	if bin != "" {
		p, err := exec.LookPath(bin)
		if err != nil {
			return nil, fmt.Errorf("chlocal: %w: %s: %w", ErrNotInstalled, bin, err)
		}
		return []string{p}, nil
	}
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return []string{p}, nil
	}
	if st, err := os.Stat("/usr/sbin/clickhouse-server"); err == nil && !st.IsDir() {
		return []string{"/usr/sbin/clickhouse-server"}, nil
	}
	if p, err := exec.LookPath("clickhouse"); err == nil {
		return []string{p, "server"}, nil
	}
	return nil, fmt.Errorf("chlocal: %w (apt-get install clickhouse-server, or run scripts/deps.sh)", ErrNotInstalled)
}

// freePort asks the kernel for a free loopback port. The port is released
// before the server binds it; Start retries if someone else takes it.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("chlocal: pick a port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
