package topology

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Forward is a plain TCP relay in the test process: a listener in a node's
// namespace on its address, each accepted connection joined to a port of
// that namespace's loopback (dialled from inside the namespace). It makes
// a loopback-only service of a node — the managed clickhouse-server, which
// listens on 127.0.0.1 only (pipeline/chlocal) — reachable from the other
// nodes, with the node's own fate: its link down or its namespace's
// process gone, the service is gone too.
type Forward struct {
	ln     net.Listener
	ns     string
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// ForwardLoopback listens on nd's address at port and relays each
// connection to 127.0.0.1:target inside nd's namespace. Close stops it.
func (nd *Node) ForwardLoopback(port, target int) (*Forward, error) {
	ln, err := listenInNS(nd.NS, fmt.Sprintf("%s:%d", nd.IP, port))
	if err != nil {
		return nil, fmt.Errorf("forward listener in %s: %w", nd.NS, err)
	}
	f := &Forward{ln: ln, ns: nd.NS, target: fmt.Sprintf("127.0.0.1:%d", target), conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Close stops listening and closes every relayed connection.
func (f *Forward) Close() error {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	err := f.ln.Close()
	f.wg.Wait()
	return err
}

func (f *Forward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forward) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
		_ = c.Close()
	}
}

func (f *Forward) accept() {
	defer f.wg.Done()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(in) {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			out, err := dialInNS(f.ns, f.target)
			if err != nil {
				f.untrack(in)
				return
			}
			if !f.track(out) {
				f.untrack(in)
				return
			}
			var pipes sync.WaitGroup
			pipes.Add(2)
			// Either direction ending ends both: the peers see the
			// close as they would the service's.
			go func() { defer pipes.Done(); _, _ = io.Copy(out, in); f.untrack(in, out) }()
			go func() { defer pipes.Done(); _, _ = io.Copy(in, out); f.untrack(in, out) }()
			pipes.Wait()
		}()
	}
}

var _ io.Closer = (*Forward)(nil)
