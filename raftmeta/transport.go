package raftmeta

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/pki"
)

// The Raft port is shared by two services, told apart by the first byte of
// each connection (rqlite's cluster mux does the same): Raft's own RPCs, and
// a one-shot "who are you" answer giving the node's ID and HTTP address. A
// follower knows only the leader's Raft address (from Raft's RPC headers);
// asking that address for its metadata is how it finds where to forward
// writes, without storing anything in the catalog or in Raft's
// configuration.
const (
	muxRaft byte = 1
	muxMeta byte = 2

	muxHeaderTimeout = 5 * time.Second
)

// nodeMeta is what the meta service answers.
type nodeMeta struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// muxLayer is the raft.StreamLayer over the shared port. Close stops the
// accept loop; connections already handed to Raft are Raft's to close.
type muxLayer struct {
	ln        net.Listener
	advertise net.Addr
	meta      func() nodeMeta
	tls       *pki.Loader // nil: plain TCP

	raftConns chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// Raft's NetworkTransport does not close the connections it accepted or
	// pooled when it closes; their reader goroutines would wait for the peer
	// forever. The layer tracks every Raft connection and closes the rest on
	// Close, so a closed node leaves no goroutine behind.
	connMu sync.Mutex
	conns  map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	m    *muxLayer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.m.connMu.Lock()
		delete(c.m.conns, c)
		c.m.connMu.Unlock()
	})
	return c.Conn.Close()
}

// track registers c, or closes it and returns nil when the layer is closed.
func (m *muxLayer) track(c net.Conn) net.Conn {
	tc := &trackedConn{Conn: c, m: m}
	m.connMu.Lock()
	defer m.connMu.Unlock()
	if m.conns == nil {
		c.Close()
		return nil
	}
	m.conns[tc] = struct{}{}
	return tc
}

var _ raft.StreamLayer = (*muxLayer)(nil)

func newMuxLayer(ln net.Listener, advertise string, meta func() nodeMeta, tlsL *pki.Loader) (*muxLayer, error) {
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
	}
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, fmt.Errorf("raft advertise address %q is not routable", advertise)
	}
	m := &muxLayer{ln: ln, advertise: adv, meta: meta, tls: tlsL, raftConns: make(chan net.Conn), closed: make(chan struct{}),
		conns: map[*trackedConn]struct{}{}}
	m.wg.Add(1)
	go m.acceptLoop()
	return m, nil
}

func (m *muxLayer) acceptLoop() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		m.wg.Add(1)
		go m.route(c)
	}
}

// route reads the header byte and hands the connection to its service.
func (m *muxLayer) route(c net.Conn) {
	defer m.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(muxHeaderTimeout))
	if m.tls != nil {
		// Both services of the port are for catalog voters only: Raft's
		// RPCs and the metadata answer.
		tc := tls.Server(c, m.tls.Server())
		if err := tc.Handshake(); err != nil {
			c.Close()
			return
		}
		st := tc.ConnectionState()
		if id, ok := pki.PeerIdentity(&st); !ok || !id.Has(pki.RoleCatalog) {
			tc.Close()
			return
		}
		c = tc
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch b[0] {
	case muxRaft:
		tc := m.track(c)
		if tc == nil {
			return
		}
		select {
		case m.raftConns <- tc:
		case <-m.closed:
			tc.Close()
		}
	case muxMeta:
		_ = c.SetWriteDeadline(time.Now().Add(muxHeaderTimeout))
		_ = json.NewEncoder(c).Encode(m.meta())
		c.Close()
	default:
		c.Close()
	}
}

// Accept implements net.Listener for Raft.
func (m *muxLayer) Accept() (net.Conn, error) {
	select {
	case c := <-m.raftConns:
		return c, nil
	case <-m.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes every Raft connection still open; it
// returns when the accept loop has exited.
func (m *muxLayer) Close() error {
	var err error
	m.closeOnce.Do(func() {
		close(m.closed)
		err = m.ln.Close()
		m.wg.Wait()
		m.connMu.Lock()
		conns := m.conns
		m.conns = nil
		m.connMu.Unlock()
		for c := range conns {
			c.Conn.Close()
		}
	})
	return err
}

func (m *muxLayer) Addr() net.Addr { return m.advertise }

// Dial opens a Raft connection to a peer's shared port.
func (m *muxLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := dialMux(string(address), timeout, m.tls)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{muxRaft}); err != nil {
		c.Close()
		return nil, err
	}
	tc := m.track(c)
	if tc == nil {
		return nil, net.ErrClosed
	}
	return tc, nil
}

// lookupMeta asks the node at a Raft address for its ID and HTTP address.
func lookupMeta(raftAddr string, timeout time.Duration, tlsL *pki.Loader) (nodeMeta, error) {
	c, err := dialMux(raftAddr, timeout, tlsL)
	if err != nil {
		return nodeMeta{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{muxMeta}); err != nil {
		return nodeMeta{}, err
	}
	var nm nodeMeta
	if err := json.NewDecoder(c).Decode(&nm); err != nil {
		return nodeMeta{}, fmt.Errorf("node metadata from %s: %w", raftAddr, err)
	}
	return nm, nil
}

// dialMux connects to a peer's Raft port: over TLS (a catalog voter's
// certificate on both sides) when tlsL is set.
func dialMux(addr string, timeout time.Duration, tlsL *pki.Loader) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", addr)
	if err != nil || tlsL == nil {
		return c, err
	}
	tc := tls.Client(c, tlsL.ClientFor(pki.RoleCatalog))
	_ = tc.SetDeadline(time.Now().Add(timeout))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}
