// Package sandbox builds throwaway network-namespace sandboxes for isolatord's
// integration tests, demos and benchmarks, so nothing ever touches the root
// network namespace (whose eth0 and lo are the machine's only link).
//
// A Sandbox is two named network namespaces, visible to `ip netns` as
// /run/netns/<name>:
//
//	client (isot-XXXXXX-client)            host (isot-XXXXXX-host)
//	  lo up                                  lo up
//	  eth0 198.18.0.2/24  <---- veth ---->   eth0 198.18.0.1/24
//	                                         default via 198.18.0.2
//	                                         ip_local_port_range 61000 61999
//
// With WithIPv6 (ipv6.go) both eth0s also get an address of a /64 of
// 2001:db8::/32 of the sandbox's own, and the host an IPv6 default route
// via the client's link-local address.
//
// The host namespace plays the machine isolatord runs on (its eth0 has a
// gateway, like a real host); the client namespace plays the outside world.
// Containers (StartContainer) are processes in fresh, unnamed network
// namespaces that nothing links to until the data plane plumbs them.
//
// Namespaces are created in pure Go: a locked, throwaway OS thread unshares a
// new network namespace and bind-mounts /proc/thread-self/ns/net onto
// /run/netns/<name>, exactly what `ip netns add` does (including making
// /run/netns a shared mount point). Code runs inside a namespace through NS.Do
// (Go, on a locked thread), NS.Netlink (a netlink handle opened there) or
// NS.Command (nsenter --net, which keeps the mount namespace, so bind mounts a
// daemon makes under /run/netns are visible to everyone).
//
// Typical use:
//
//	s := sandbox.New(t)                       // skips unless root
//	bin := traffic.BinaryPath(t)              // go build of test/cmd/isotraffic, once per process
//	c := s.StartContainer(t, "web", bin, "serve", "--tcp", ":8080", "--udp", ":8080", "--name", "web")
//	c.WaitFor(t, "ready", 10*time.Second)
//	// ... the data plane plumbs c (c.Pid, c.NetNS) into s.Host ...
//	out := s.Client.Run(t, bin, "echo", "--addr", "198.18.0.1:8080", "--msg", "hi") // "web hi\n"
//	var reply string // "web hi"
//	err := s.Client.Do(func() (err error) {
//		reply, err = traffic.Echo(ctx, "udp", "198.18.0.1:8080", "hi")
//		return err
//	})
//
// Teardown (t.Cleanup in New, or Close) kills and reaps containers by pid, then
// unmounts and removes the namespaces, which destroys their veths. It runs even
// when a test fails, and Leftovers reports anything that survived. If the
// test process itself dies, containers die with it (Pdeathsig) and the next
// sandbox created on the machine deletes the orphaned namespaces (see
// RegistryDir).
package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Addresses and settings of every sandbox.
var (
	// HostIP is the host namespace's eth0 address (the "host IP" containers share).
	HostIP = net.IPv4(198, 18, 0, 1).To4()
	// ClientIP is the client namespace's eth0 address, the host's gateway.
	ClientIP = net.IPv4(198, 18, 0, 2).To4()
	// PrefixLen is the prefix length of the host–client link.
	PrefixLen = 24
)

// HostPortRange is the host namespace's net.ipv4.ip_local_port_range, chosen
// not to overlap the ephemeral pools the daemon hands to containers.
const HostPortRange = "61000 61999"

// Sandbox is a host namespace and a client namespace joined by a veth, plus
// the containers started in it.
type Sandbox struct {
	Name     string           // unique name, prefix of the namespace names
	Host     NS               // plays the machine: eth0 = HostIP/24, default via ClientIP
	Client   NS               // plays the outside world: eth0 = ClientIP/24
	HostIP   net.IP           // 198.18.0.1
	ClientIP net.IP           // 198.18.0.2
	HostMAC  net.HardwareAddr // MAC of the host namespace's eth0
	HostEth0 string           // "eth0": the host namespace's uplink
	// IPv6 (WithIPv6 only; ipv6.go): the host's and the client's global
	// addresses, and the client's link-local address, the host's IPv6
	// default gateway. nil without IPv6.
	HostIP6, ClientIP6, RouterLL6 net.IP

	ipv6 bool

	mu         sync.Mutex
	containers []*Container
	closed     bool
}

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

// New builds a sandbox named isot-<random> for a test, skipping when not root.
// t.Cleanup tears it all down (containers, namespaces) even if the test fails,
// and reports an error if anything is left over.
func New(t testing.TB, opts ...Option) *Sandbox {
	t.Helper()
	RequireRoot(t)
	s, err := NewNamed("isot", opts...)
	if err != nil {
		t.Fatalf("sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("sandbox %s teardown: %v", s.Name, err)
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("sandbox %s left namespaces behind: %v", s.Name, left)
		}
	})
	return s
}

// NewNamed builds a sandbox named <prefix>-<random> without a testing.T (for
// demos and benchmark programs). The caller must call Close. On error nothing
// is left behind.
func NewNamed(prefix string, opts ...Option) (*Sandbox, error) {
	if prefix == "" {
		prefix = "isot"
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := prefix + "-" + hex.EncodeToString(rnd[:])
	s := &Sandbox{
		Name:     name,
		HostIP:   append(net.IP(nil), HostIP...),
		ClientIP: append(net.IP(nil), ClientIP...),
		HostEth0: "eth0",
	}
	for _, o := range opts {
		o(s)
	}
	if s.ipv6 {
		s.setIPv6Addrs(rnd)
	}
	if err := s.build(); err != nil {
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
		return nil, fmt.Errorf("build sandbox %s: %w", name, err)
	}
	return s, nil
}

func (s *Sandbox) build() error {
	unlock, err := lockRegistry()
	if err != nil {
		return err
	}
	sweepStale()
	if err := ensureNetnsDir(); err != nil {
		unlock()
		return err
	}
	if err := register(s.Name); err != nil {
		unlock()
		return err
	}
	unlock()
	if s.Host, err = createNamedNS(s.Name + "-host"); err != nil {
		return err
	}
	if s.Client, err = createNamedNS(s.Name + "-client"); err != nil {
		return err
	}
	hostNL, err := s.Host.Netlink()
	if err != nil {
		return err
	}
	defer hostNL.Close()
	clientNL, err := s.Client.Netlink()
	if err != nil {
		return err
	}
	defer clientNL.Close()

	clientFd, err := netns.GetFromPath(s.Client.Path)
	if err != nil {
		return err
	}
	defer clientFd.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostEth0},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(clientFd)),
	}
	if err := hostNL.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth host eth0 <-> client eth0: %w", err)
	}
	if s.ipv6 {
		if err := s.noDAD(); err != nil {
			return err
		}
	}
	if err := configureLink(hostNL, s.HostEth0, &net.IPNet{IP: s.HostIP, Mask: net.CIDRMask(PrefixLen, 32)}); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if err := configureLink(clientNL, "eth0", &net.IPNet{IP: s.ClientIP, Mask: net.CIDRMask(PrefixLen, 32)}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	hostEth0, err := hostNL.LinkByName(s.HostEth0)
	if err != nil {
		return err
	}
	s.HostMAC = append(net.HardwareAddr(nil), hostEth0.Attrs().HardwareAddr...)
	if err := hostNL.RouteAdd(&netlink.Route{
		LinkIndex: hostEth0.Attrs().Index,
		Gw:        s.ClientIP,
		Scope:     netlink.SCOPE_UNIVERSE,
	}); err != nil {
		return fmt.Errorf("host default route via %s: %w", s.ClientIP, err)
	}
	if s.ipv6 {
		if err := s.configureIPv6(hostNL, clientNL); err != nil {
			return err
		}
	}
	return s.Host.Do(func() error {
		return writeSysctl("net/ipv4/ip_local_port_range", HostPortRange)
	})
}

// configureLink brings lo and the named link up and gives the link ipnet.
func configureLink(h *netlink.Handle, name string, ipnet *net.IPNet) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: ipnet}
	if err := h.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("%s add %s: %w", name, addr.IPNet, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

// sysctlPath maps "net.ipv4.ip_forward" or "net/ipv4/ip_forward" to its /proc/sys file.
func sysctlPath(key string) string {
	key = strings.TrimPrefix(key, "/")
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return "/proc/sys/" + key
}

// writeSysctl writes a sysctl of the calling thread's network namespace
// (/proc/sys/net is per thread); call it inside a Do.
func writeSysctl(key, value string) error {
	if err := os.WriteFile(sysctlPath(key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%q: %w", key, value, err)
	}
	return nil
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// SetSysctl sets a sysctl ("net.ipv4.ip_forward" or "net/ipv4/ip_forward")
// inside n.
func (n NS) SetSysctl(key, value string) error {
	return n.Do(func() error { return writeSysctl(key, value) })
}

// Sysctl reads a sysctl inside n, trimmed ("61000\t61999" for a port range).
func (n NS) Sysctl(key string) (v string, err error) {
	err = n.Do(func() (err error) { v, err = readSysctl(key); return err })
	return v, err
}

// EnterHost switches the calling goroutine's OS thread into the host
// namespace and locks it there. restore switches back and unlocks; if that
// fails the thread stays locked so it dies with the goroutine. Prefer
// s.Host.Do where possible; never start goroutines expecting them to be in
// the host namespace.
func (s *Sandbox) EnterHost() (restore func(), err error) {
	target, err := netns.GetFromPath(s.Host.Path)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	if err := netns.Set(target); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", s.Host.Name, err)
	}
	return func() {
		defer orig.Close()
		if err := netns.Set(orig); err != nil {
			return // keep the thread locked: it dies with its goroutine
		}
		runtime.UnlockOSThread()
	}, nil
}

// Close kills and reaps the sandbox's containers, then deletes its
// namespaces. It is idempotent and returns every error it met.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	cs := s.containers
	s.containers = nil
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i].Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	// Deleting the client first destroys the veth pair; then the host.
	for _, n := range []NS{s.Client, s.Host} {
		if err := deleteNamedNS(n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		unregister(s.Name)
	}
	return errors.Join(errs...)
}

// Leftovers lists this sandbox's namespaces still present in /run/netns (what
// `ip netns list` shows). After Close it should be empty.
func (s *Sandbox) Leftovers() []string {
	ents, err := os.ReadDir(NetnsDir)
	if err != nil {
		return nil
	}
	var left []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), s.Name+"-") {
			left = append(left, e.Name())
		}
	}
	return left
}
