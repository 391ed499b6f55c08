package topology

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helperEnv makes the test binary a TCP echo-less acceptor on the address
// it names, run inside a node's namespace by the tests below.
const helperEnv = "SHOAL_TOPOLOGY_LISTEN"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			os.Exit(3)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(4)
			}
			_ = c.Close()
		}
	}
	os.Exit(m.Run())
}

func requireNet(t *testing.T) *Net {
	if testing.Short() {
		t.Skip("network namespaces; skipped with -short")
	}
	if err := Available(); err != nil {
		if os.Getenv("SHOAL_REQUIRE_NETNS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	n, err := NewNet()
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, n.Close())
		_, err := os.Stat("/run/netns/" + n.bridgeNS)
		assert.True(t, errors.Is(err, os.ErrNotExist), "bridge namespace left behind")
	})
	return n
}

// listenIn runs the helper acceptor in nd's namespace on port 9000.
func listenIn(t *testing.T, nd *Node) string {
	addr := nd.IP + ":9000"
	cmd := nd.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	require.Eventually(t, func() bool { return dial(addr) == nil }, 10*time.Second, 50*time.Millisecond, "helper never listened on %s", addr)
	return addr
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err == nil {
		_ = c.Close()
	}
	return err
}

// Isolate must really cut the node off (from the root namespace and from
// another node) and Rejoin must restore it: the partition failpoint is only
// as good as this.
func TestIsolateCutsTheNodeOffAndRejoinRestoresIt(t *testing.T) {
	n := requireNet(t)
	a, err := n.AddNode("ta")
	require.NoError(t, err)
	b, err := n.AddNode("tb")
	require.NoError(t, err)
	addrA := listenIn(t, a)
	addrB := listenIn(t, b)
	fromB := func(addr string) error {
		// A node-to-node dial, from inside b's namespace.
		out, err := b.Command("bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(addr, ":", "/", 1)).CombinedOutput()
		if err != nil {
			return errors.New(string(out))
		}
		return nil
	}
	require.NoError(t, fromB(addrA), "b reaches a before the partition")

	require.NoError(t, a.Isolate())
	assert.Error(t, dial(addrA), "the root namespace still reaches an isolated node")
	assert.Error(t, exec.Command("ip", "netns", "exec", b.NS, "timeout", "2", "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(addrA, ":", "/", 1)).Run(),
		"another node still reaches an isolated node")
	assert.NoError(t, dial(addrB), "isolating a cut off b too")

	require.NoError(t, a.Rejoin())
	assert.Eventually(t, func() bool { return dial(addrA) == nil }, 10*time.Second, 100*time.Millisecond, "a unreachable after Rejoin")
}

// Throttle and Unshape work on this kernel (tbf); Delay needs netem and
// reports ErrUnsupported where the kernel lacks it.
func TestShapingAppliesAndIsRemoved(t *testing.T) {
	n := requireNet(t)
	a, err := n.AddNode("ta")
	require.NoError(t, err)
	addr := listenIn(t, a)
	require.NoError(t, a.Throttle("256kbit"))
	assert.NoError(t, dial(addr), "a throttled node is still reachable")
	require.NoError(t, a.Unshape())
	if err := a.Delay("50ms"); err != nil {
		require.ErrorIs(t, err, ErrUnsupported)
		t.Logf("netem unavailable here: %v", err)
	} else {
		require.NoError(t, a.Unshape())
	}
	assert.NoError(t, dial(addr))
}

func TestOwnerPid(t *testing.T) {
	for name, want := range map[string]int{"shrb123-n1": 123, "shrb77r": 77, "shrb9-br": 9} {
		pid, ok := ownerPid(name)
		assert.True(t, ok, name)
		assert.Equal(t, want, pid, name)
	}
	for _, name := range []string{"eth0", "shrb-x", "other123-n1"} {
		_, ok := ownerPid(name)
		assert.False(t, ok, name)
	}
}

// A crashed run's namespace (its pid gone) is removed at the next start; a
// live run's is left alone.
func TestCleanStaleRemovesOnlyDeadRuns(t *testing.T) {
	n := requireNet(t) // live: ours
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale := NamePrefix + strconv.Itoa(dead.Process.Pid) + "-x"
	require.NoError(t, ip("netns", "add", stale))
	t.Cleanup(func() { _ = ip("netns", "del", stale) })
	CleanStale()
	_, err := os.Stat("/run/netns/" + stale)
	assert.True(t, errors.Is(err, os.ErrNotExist), "a dead run's namespace survived")
	_, err = os.Stat("/run/netns/" + n.bridgeNS)
	assert.NoError(t, err, "a live run's namespace was removed")
}

// echoIn serves an echo on nd's address and port, with its listening socket
// in nd's namespace.
func echoIn(t *testing.T, nd *Node, port int) string {
	addr := nd.IP + ":" + strconv.Itoa(port)
	ln, err := listenInNS(nd.NS, addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	return addr
}

func echoOnce(c net.Conn, msg string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	b := make([]byte, len(msg))
	_, err := io.ReadFull(c, b)
	return string(b), err
}

// DelayPort really puts the relay between another node and the port: a
// connection open before it is reset, a new one is carried by the relay
// (its byte count grows) and still works, and after Close new connections
// go direct again.
func TestDelayPortRelaysNewConnectionsAndResetsOld(t *testing.T) {
	n := requireNet(t)
	a, err := n.AddNode("ta")
	require.NoError(t, err)
	b, err := n.AddNode("tb")
	require.NoError(t, err)
	addr := echoIn(t, a, 9100)
	old, err := dialInNS(b.NS, addr)
	require.NoError(t, err)
	defer old.Close()
	got, err := echoOnce(old, "before")
	require.NoError(t, err)
	require.Equal(t, "before", got)

	r, err := a.DelayPort(9100, 20*time.Millisecond)
	require.NoError(t, err)
	_, err = echoOnce(old, "old")
	assert.Error(t, err, "a connection that predates the relay must be reset")

	c, err := dialInNS(b.NS, addr)
	require.NoError(t, err)
	got, err = echoOnce(c, "through the relay")
	require.NoError(t, err)
	assert.Equal(t, "through the relay", got)
	// The relay counts a chunk once its write returned, which can be just
	// after the client read it.
	var bytes, conns int64
	require.Eventually(t, func() bool {
		bytes, conns = r.Relayed()
		return bytes == int64(2*len("through the relay"))
	}, 10*time.Second, time.Millisecond, "the echo went both ways through the relay")
	assert.EqualValues(t, 1, conns)

	require.NoError(t, r.Close())
	_, err = echoOnce(c, "x")
	assert.Error(t, err, "Close drops the relayed connections")
	d, err := dialInNS(b.NS, addr)
	require.NoError(t, err)
	defer d.Close()
	got, err = echoOnce(d, "direct")
	require.NoError(t, err)
	assert.Equal(t, "direct", got)
	after, _ := r.Relayed()
	assert.Equal(t, bytes, after, "after Close nothing goes through the relay")
}

// Lose drops packets (at 100% nothing gets through) and Unlose restores the
// link.
func TestLoseDropsAndUnloseRestores(t *testing.T) {
	n := requireNet(t)
	a, err := n.AddNode("ta")
	require.NoError(t, err)
	addr := listenIn(t, a)
	require.NoError(t, a.Lose(100))
	assert.Error(t, dial(addr), "a node losing every packet still answers")
	require.NoError(t, a.Unlose())
	assert.NoError(t, dial(addr))
}
