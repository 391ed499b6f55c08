package topology

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Lag and loss without netem. This kernel has no netem qdisc, so a delayed
// link is built from parts that exist everywhere: a TCP relay in the test
// process whose listening socket lives in the node's namespace, and an
// iptables REDIRECT there that sends every new connection to one port of
// the node through it. The relay forwards each chunk it reads after the
// delay, in both directions, so every request and every answer on those
// connections arrives late: for the catalog's raft port, the leader's
// appends and their acknowledgements take delay each way — a follower
// that lags without being cut off. Loss is iptables' statistic match.

// Relay is a delaying TCP relay in front of one port of a node
// (Node.DelayPort). Close removes the redirect and drops every relayed
// connection (their peers reconnect directly).
type Relay struct {
	nd      *Node
	ln      net.Listener
	delay   time.Duration
	target  string
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
	relayed atomic.Int64 // bytes forwarded, both directions
	accepts atomic.Int64 // connections taken over
}

// DelayPort delays, by d each way, every TCP connection made to port on nd
// from now on, except the relay's own (from the test's address), and
// resets the connections already open to that port so their peers
// reconnect through the relay. Close undoes it.
func (nd *Node) DelayPort(port int, d time.Duration) (*Relay, error) {
	if err := iptablesAvailable(); err != nil {
		return nil, err
	}
	ln, err := listenInNS(nd.NS, nd.IP+":0")
	if err != nil {
		return nil, fmt.Errorf("relay listener in %s: %w", nd.NS, err)
	}
	_, rport, _ := net.SplitHostPort(ln.Addr().String())
	r := &Relay{nd: nd, ln: ln, delay: d, target: net.JoinHostPort(nd.IP, strconv.Itoa(port)), conns: map[net.Conn]struct{}{}}
	self := nd.net.RootIP()
	p := strconv.Itoa(port)
	if err := errors.Join(
		nd.iptables("-t", "nat", "-I", "PREROUTING", "-p", "tcp", "--dport", p, "!", "-s", self, "-j", "REDIRECT", "--to-ports", rport),
		// Connections that predate the redirect keep their original
		// destination port: reset them, so the peer dials again.
		nd.iptables("-I", "INPUT", "-p", "tcp", "--dport", p, "!", "-s", self, "-j", "REJECT", "--reject-with", "tcp-reset"),
	); err != nil {
		_ = r.Close()
		return nil, err
	}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Relayed is how many bytes the relay has forwarded (both directions) and
// over how many connections.
func (r *Relay) Relayed() (bytes, conns int64) { return r.relayed.Load(), r.accepts.Load() }

// Close removes the redirect and the reset rule, stops the relay and closes
// every connection it carries.
func (r *Relay) Close() error {
	err := errors.Join(r.nd.iptables("-t", "nat", "-F"), r.nd.iptables("-F"))
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
	return err
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(in) {
			return
		}
		r.accepts.Add(1)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
			if err != nil || !r.track(out) {
				_ = in.Close()
				return
			}
			var pipes sync.WaitGroup
			pipes.Add(2)
			go func() { defer pipes.Done(); r.pipe(out, in) }()
			go func() { defer pipes.Done(); r.pipe(in, out) }()
			pipes.Wait()
			_ = in.Close()
			_ = out.Close()
		}()
	}
}

type chunk struct {
	at   time.Time
	data []byte
}

// pipe copies src to dst, each chunk delay after it was read, in order.
func (r *Relay) pipe(dst, src net.Conn) {
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now(), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at.Add(r.delay)))
		if _, err := dst.Write(c.data); err != nil {
			_ = src.Close()
			for range q { // let the reader end
			}
			return
		}
		r.relayed.Add(int64(len(c.data)))
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// listenInNS opens a TCP listener inside the named network namespace: a
// socket belongs to the namespace of the thread that created it.
func listenInNS(ns, addr string) (ln net.Listener, err error) {
	err = inNS(ns, func() error {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// dialInNS dials addr from inside the named network namespace (tests).
func dialInNS(ns, addr string) (c net.Conn, err error) {
	err = inNS(ns, func() error {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

// inNS runs fn on a thread moved into the named network namespace, then
// moves the thread back before releasing it. The thread must survive:
// the suite's processes carry Pdeathsig, which the kernel fires when the
// *thread* that started them ends, and Go ends a thread whose goroutine
// exits while locked to it — any process this thread had started would be
// killed. If the way back fails, the thread is left locked and ends with
// the goroutine (the lesser harm: a namespace leaking into the runtime's
// thread pool would misroute every later socket).
func inNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", ns, err))
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Lose drops each packet into and out of the node with probability pct
// percent (iptables statistic match in its namespace; Net.Heal removes
// it). TCP retransmits what is lost: connections slow down and stall, and
// nothing sees an error until timeouts.
func (nd *Node) Lose(pct int) error {
	if err := iptablesAvailable(); err != nil {
		return err
	}
	p := strconv.FormatFloat(float64(pct)/100, 'f', 3, 64)
	return errors.Join(
		nd.iptables("-I", "INPUT", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"),
		nd.iptables("-I", "OUTPUT", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"))
}

// Unlose removes Lose's rules (the node's filter table holds nothing else
// while a loss fault runs).
func (nd *Node) Unlose() error { return nd.iptables("-F") }

// RootIP is the test process's address on the network.
func (n *Net) RootIP() string { return n.subnet + ".254" }

var _ io.Closer = (*Relay)(nil)
