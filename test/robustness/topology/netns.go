package topology

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// NamePrefix starts the name of every network namespace and root-namespace
// interface this package creates, followed by the creating process's pid:
// "shrb1234-n1". A run that crashed leaves names whose pid is dead; CleanStale
// removes exactly those.
const NamePrefix = "shrb"

// ErrUnsupported means the kernel lacks what a network fault needs (e.g. the
// netem qdisc): the failpoint cannot run on this machine.
var ErrUnsupported = errors.New("not supported by this kernel")

// lockPath serialises subnet allocation between concurrent runs (other test
// binaries on the same machine pick their subnets at the same time).
const lockPath = "/tmp/shoal-robustness-net.lock"

// Net is a private layer-2 network: a bridge in a namespace of its own, one
// namespace per node joined to it by a veth pair, and one veth pair from the
// caller's (root) namespace so the test process reaches every node. Addresses
// are 10.213.X.0/24, X chosen unused in the root namespace.
//
// A partition is a real one: the node's port on the bridge goes down, and
// packets to and from it are dropped on the wire (nothing in the node sees a
// closed socket). Safe for concurrent use.
type Net struct {
	prefix   string // NamePrefix + pid
	subnet   string // "10.213.X"
	bridgeNS string
	rootIf   string

	mu     sync.Mutex
	nodes  []*Node
	closed bool
}

// Node is one network namespace on the Net, with address IP on its eth0.
type Node struct {
	Name string
	NS   string
	IP   string
	port string // its veth end on the bridge, in the bridge namespace
	net  *Net
}

// Available reports why netns topologies cannot be built here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root (ip netns add)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("iproute2's ip not found: %w", err)
	}
	return nil
}

// NewNet creates the bridge namespace and the root-namespace link. Close
// removes everything it and AddNode created.
func NewNet() (*Net, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	CleanStale()
	n := &Net{prefix: NamePrefix + strconv.Itoa(os.Getpid())}
	n.bridgeNS, n.rootIf = n.prefix+"-br", n.prefix+"r"
	unlock, err := lockFile()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if n.subnet, err = freeSubnet(); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"netns", "add", n.bridgeNS},
		{"-n", n.bridgeNS, "link", "add", "br0", "type", "bridge"},
		{"-n", n.bridgeNS, "link", "set", "br0", "up"},
		{"link", "add", n.rootIf, "type", "veth", "peer", "name", "p-root", "netns", n.bridgeNS},
		{"-n", n.bridgeNS, "link", "set", "p-root", "master", "br0", "up"},
		{"addr", "add", n.subnet + ".254/24", "dev", n.rootIf},
		{"link", "set", n.rootIf, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Subnet is the /24 of the network, e.g. "10.213.7".
func (n *Net) Subnet() string { return n.subnet }

// AddNode creates the namespace of one node, with lo up and eth0 on the bridge.
func (n *Net) AddNode(name string) (*Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.nodes) >= 250 {
		return nil, errors.New("too many nodes for a /24")
	}
	nd := &Node{Name: name, NS: n.prefix + "-" + name, IP: fmt.Sprintf("%s.%d", n.subnet, len(n.nodes)+1), port: "p-" + name, net: n}
	if len(nd.port) > 15 {
		return nil, fmt.Errorf("node name %q too long for an interface name", name)
	}
	steps := [][]string{
		{"netns", "add", nd.NS},
		{"-n", n.bridgeNS, "link", "add", nd.port, "type", "veth", "peer", "name", "eth0", "netns", nd.NS},
		{"-n", n.bridgeNS, "link", "set", nd.port, "master", "br0", "up"},
		{"-n", nd.NS, "addr", "add", nd.IP + "/24", "dev", "eth0"},
		{"-n", nd.NS, "link", "set", "eth0", "up"},
		{"-n", nd.NS, "link", "set", "lo", "up"},
	}
	n.nodes = append(n.nodes, nd) // Close removes it even if a step fails
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, err
		}
	}
	return nd, nil
}

// Close deletes every namespace and the root link. Processes still running in
// a namespace keep it alive: stop them first.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	for _, nd := range n.nodes {
		if err := ip("netns", "del", nd.NS); err != nil {
			errs = append(errs, err)
		}
	}
	_ = ip("link", "del", n.rootIf) // gone with its peer already, usually
	if err := ip("netns", "del", n.bridgeNS); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Command returns a command that runs bin in the node's namespace. The
// command is `ip netns exec`, which execs bin: the process is bin itself.
func (nd *Node) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", nd.NS, bin}, args...)...)
}

// Isolate takes the node's bridge port down: no packet reaches or leaves the
// node until Rejoin. The node's own interface stays up (it sees no error,
// only silence, as behind a failed switch port).
func (nd *Node) Isolate() error {
	return ip("-n", nd.net.bridgeNS, "link", "set", nd.port, "down")
}

// Rejoin undoes Isolate.
func (nd *Node) Rejoin() error { return ip("-n", nd.net.bridgeNS, "link", "set", nd.port, "up") }

// Delay adds d of latency to every packet leaving and entering the node
// (netem on both veth ends). ErrUnsupported without the netem qdisc.
func (nd *Node) Delay(d string) error {
	return nd.shape("netem", "delay", d)
}

// Throttle limits the node's bandwidth both ways to rate (tbf: e.g.
// "256kbit"), so bulk replication queues behind it while small messages
// still pass: a follower that falls behind without being cut off.
func (nd *Node) Throttle(rate string) error {
	return nd.shape("tbf", "rate", rate, "burst", "16kb", "latency", "5s")
}

// Unshape removes Delay or Throttle.
func (nd *Node) Unshape() error {
	return errors.Join(
		ignoreMissing(tc("-n", nd.NS, "qdisc", "del", "dev", "eth0", "root")),
		ignoreMissing(tc("-n", nd.net.bridgeNS, "qdisc", "del", "dev", nd.port, "root")))
}

func (nd *Node) shape(kind string, params ...string) error {
	for _, at := range [][]string{{"-n", nd.NS, "qdisc", "replace", "dev", "eth0"}, {"-n", nd.net.bridgeNS, "qdisc", "replace", "dev", nd.port}} {
		err := tc(append(append(at, "root", kind), params...)...)
		if err != nil && strings.Contains(err.Error(), "qdisc kind is unknown") {
			_ = nd.Unshape()
			return fmt.Errorf("%s qdisc: %w", kind, ErrUnsupported)
		}
		if err != nil {
			_ = nd.Unshape()
			return err
		}
	}
	return nil
}

func ignoreMissing(err error) error {
	if err != nil && (strings.Contains(err.Error(), "handle of zero") || strings.Contains(err.Error(), "Cannot find")) {
		return nil
	}
	return err
}

// CleanStale removes namespaces and root links left by runs whose process is
// gone (a test binary killed before its cleanups ran). Live runs' names are
// left alone.
func CleanStale() {
	entries, _ := os.ReadDir("/run/netns")
	dead := map[int]bool{}
	for _, e := range entries {
		pid, ok := ownerPid(e.Name())
		if !ok || alive(pid) {
			continue
		}
		dead[pid] = true
		_ = ip("netns", "del", e.Name())
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		if pid, ok := ownerPid(l.Name()); ok && !alive(pid) {
			_ = ip("link", "del", l.Name())
		}
	}
}

// ownerPid parses "shrb<pid>-…" or "shrb<pid>r".
func ownerPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, NamePrefix)
	if !ok {
		return 0, false
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	pid, err := strconv.Atoi(rest[:end])
	return pid, err == nil && pid > 0
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freeSubnet picks 10.213.X.0/24 with X unused by any address or route of
// the root namespace.
func freeSubnet() (string, error) {
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip addr: %w: %s", err, out)
	}
	routes, err := exec.Command("ip", "-4", "route", "show").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip route: %w: %s", err, routes)
	}
	used := string(out) + string(routes)
	start := os.Getpid() % 200
	for i := range 200 {
		s := fmt.Sprintf("10.213.%d", 1+(start+i)%200)
		if !strings.Contains(used, s+".") {
			return s, nil
		}
	}
	return "", errors.New("no free 10.213.X.0/24")
}

func lockFile() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Clean(lockPath), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

func ip(args ...string) error { return run("ip", args...) }

func tc(args ...string) error { return run("tc", args...) }

func run(name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("%s %s: %w: %s%s", cmd.Path, strings.Join(args, " "), err, stderr.String(), out)
	}
	return nil
}

// Partition splits the given nodes into groups that cannot reach one another:
// in each node's namespace, iptables drops every packet from or to a node of
// another group. Nodes in no group (and the test's own link) still reach
// everyone, so e.g. {n1,n2,h1,e1} / {n3,h2} is a split brain 2/1 of the
// catalog with a host and the edge on each side. Heal undoes it.
func (n *Net) Partition(groups ...[]*Node) error {
	if err := iptablesAvailable(); err != nil {
		return err
	}
	for gi, g := range groups {
		for _, nd := range g {
			for gj, other := range groups {
				if gi == gj {
					continue
				}
				for _, peer := range other {
					if err := errors.Join(nd.iptables("-I", "INPUT", "-s", peer.IP, "-j", "DROP"),
						nd.iptables("-I", "OUTPUT", "-d", peer.IP, "-j", "DROP")); err != nil {
						_ = n.Heal()
						return err
					}
				}
			}
		}
	}
	return nil
}

// DropFrom makes the link from src to nd one-way dead: nd's namespace drops
// every packet whose source is src, while src still receives what nd sends.
// (Over TCP both directions of a connection fail, but each side sees it
// differently: src's requests vanish, nd's requests arrive and their
// answers vanish.) Heal undoes it.
func (nd *Node) DropFrom(src *Node) error {
	if err := iptablesAvailable(); err != nil {
		return err
	}
	return nd.iptables("-I", "INPUT", "-s", src.IP, "-j", "DROP")
}

// Heal removes every packet filter Partition and DropFrom installed (the
// namespaces are the suite's own: their filter tables hold nothing else).
func (n *Net) Heal() error {
	n.mu.Lock()
	nodes := append([]*Node(nil), n.nodes...)
	n.mu.Unlock()
	if iptablesAvailable() != nil {
		return nil
	}
	var errs []error
	for _, nd := range nodes {
		if err := nd.iptables("-F"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (nd *Node) iptables(args ...string) error {
	return run("ip", append([]string{"netns", "exec", nd.NS, "iptables", "-w", "5"}, args...)...)
}

// iptablesAvailable reports ErrUnsupported where iptables is missing
// (scripts/deps.sh installs it).
func iptablesAvailable() error {
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("iptables not found (apt-get install iptables): %w", ErrUnsupported)
	}
	return nil
}
