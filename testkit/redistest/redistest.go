// Package redistest starts real redis-server processes for tests: a single
// node on a free loopback port, or a 3-master Redis Cluster, in plain TCP or
// TLS only (certificates from tlstest).
//
// Tests never skip because Redis is missing: when redis-server is not on
// PATH the test fails with a message saying how to install it.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/tlstest"
)

// InstallHint tells a developer how to get redis-server.
const InstallHint = "redis-server was not found on PATH; install Redis 7 " +
	"(Debian/Ubuntu: `sudo apt-get install redis-server`, macOS: `brew install redis`) " +
	"or run ./scripts/test.sh, which installs it where it can"

// Server is one redis-server process owned by a test.
type Server struct {
	Addr string
	Dir  string
	Port int
	// TLS is the client configuration that trusts a TLS server's CA; nil
	// for a plain server. A TLS server listens on Port with TLS only.
	TLS  *tls.Config
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	// Never a port this process gave out before: a server stopped to test
	// "Redis is down" keeps its port, and another test's server started
	// on it meanwhile answered in its place (throttle TestRedisDownIsAnError
	// was admitted by a stranger's Redis). Ports refused stay bound until
	// one is found, so the kernel does not offer them again.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if !portsGiven[port] {
			portsGiven[port] = true
			return port, nil
		}
	}
	return 0, errors.New("redistest: no port this process has not used before")
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Start runs a redis-server with the given extra arguments (e.g. "--requirepass", "x")
// on a free port; it is stopped when the test ends.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	s, err := Launch(tb.TempDir(), extra...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartTLS runs a redis-server that speaks TLS only (no plain port),
// presenting certs.Server; it is stopped when the test ends. Its URL is
// rediss://, and its TLS field trusts certs' CA.
func StartTLS(tb testing.TB, certs *tlstest.Certs, extra ...string) *Server {
	tb.Helper()
	return StartTLSWith(tb, certs, certs.Server, extra...)
}

// StartTLSWith is StartTLS presenting pair (e.g. certs.Expired) instead.
func StartTLSWith(tb testing.TB, certs *tlstest.Certs, pair tlstest.KeyPair, extra ...string) *Server {
	tb.Helper()
	s, err := launch(tb.TempDir(), certs, pair, extra)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts a redis-server outside a test (e.g. in TestMain, for
// examples) with its files in dir. The caller must Stop it.
func Launch(dir string, extra ...string) (*Server, error) {
	return launch(dir, nil, tlstest.KeyPair{}, extra)
}

func launch(dir string, certs *tlstest.Certs, pair tlstest.KeyPair, extra []string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New(InstallHint)
	}
	s := &Server{Dir: dir}
	s.args = []string{"--save", "", "--appendonly", "no", "--bind", "127.0.0.1"}
	if certs != nil {
		s.TLS = certs.ClientConfig()
		s.args = append(s.args, "--tls-cert-file", pair.CertFile, "--tls-key-file", pair.KeyFile,
			"--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "no")
	}
	s.args = append(s.args, extra...)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if s.Port, err = freePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redistest: start redis-server: %w", err)
}

// New starts a private redis-server and returns a client for it; both are
// closed when the test ends.
func New(tb testing.TB) (*Server, *redis.Client) {
	tb.Helper()
	s := Start(tb)
	return s, s.Client(tb)
}

// Client returns a new client for the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := s.newClient()
	tb.Cleanup(func() { c.Close() })
	return c
}

func (s *Server) newClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.TLS})
}

// URL is the redis:// (rediss:// for TLS) URL of the server.
func (s *Server) URL() string {
	if s.TLS != nil {
		return "rediss://" + s.Addr
	}
	return "redis://" + s.Addr
}

func (s *Server) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return errors.New(InstallHint)
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	args := []string{"--port", strconv.Itoa(s.Port), "--dir", s.Dir}
	if s.TLS != nil {
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port), "--dir", s.Dir}
	}
	args = append(args, s.args...)
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(s.Dir, fmt.Sprintf("redis-%d.log", s.Port)))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	s.cmd = cmd
	s.done = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(s.done) }()
	if err := waitReady(s.Addr, s.TLS != nil, s.done, 10*time.Second); err != nil {
		s.Stop()
		b, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("%w; log: %s", err, lastLines(string(b), 5))
	}
	return nil
}

// Stop kills the server (SIGKILL: data not in AOF is lost, as in a crash)
// and waits for it to exit. Safe to call twice.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Restart stops the server and starts it again on the same port and dir,
// with the same arguments (so an AOF-backed server reloads its data).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

func waitReady(addr string, useTLS bool, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	opt := &redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond}
	if useTLS {
		// The probe only asks whether the process answers; checking its
		// certificate (which may be expired on purpose) is the tests' job.
		opt.TLSConfig = &tls.Config{InsecureSkipVerify: true}
	}
	c := redis.NewClient(opt)
	defer c.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || strings.Contains(err.Error(), "NOAUTH") {
			return nil // up (a password-protected server answers NOAUTH)
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited before it was ready", addr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v: %w", addr, timeout, err)
		}
	}
}

func lastLines(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Cluster is a Redis Cluster of redis-server processes on loopback.
type Cluster struct {
	Nodes []*Server
	Addrs []string
}

// NewCluster starts a Redis Cluster with the given number of masters and
// replicas per master, waits until every slot is served, and returns a
// cluster client. Everything is stopped when the test ends.
func NewCluster(tb testing.TB, masters, replicasPerMaster int) (*Cluster, *redis.ClusterClient) {
	tb.Helper()
	return newCluster(tb, nil, masters, replicasPerMaster)
}

// NewTLSCluster is NewCluster speaking TLS only: clients, the cluster bus
// and replication all use TLS, every node presenting certs.Server. The
// returned client trusts certs' CA.
func NewTLSCluster(tb testing.TB, certs *tlstest.Certs, masters, replicasPerMaster int) (*Cluster, *redis.ClusterClient) {
	tb.Helper()
	return newCluster(tb, certs, masters, replicasPerMaster)
}

func newCluster(tb testing.TB, certs *tlstest.Certs, masters, replicasPerMaster int) (*Cluster, *redis.ClusterClient) {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatal(strings.Replace(InstallHint, "redis-server was", "redis-cli was", 1))
	}
	c := &Cluster{}
	total := masters * (1 + replicasPerMaster)
	// cluster-replica-validity-factor 0: a replica fails over however long
	// its link was down. With the default (10 × the node timeout, here 10 s)
	// a replica whose link a test cut (BreakReplication) refuses to take
	// over once a loaded machine makes the cut last over 10 s, and the old
	// master comes back with its data instead.
	nodeArgs := []string{"--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
		"--cluster-config-file", "nodes.conf", "--repl-diskless-sync-delay", "0", "--cluster-replica-validity-factor", "0"}
	var cliArgs []string
	for i := 0; i < total; i++ {
		var s *Server
		if certs == nil {
			s = Start(tb, nodeArgs...)
		} else {
			s = StartTLS(tb, certs, slices.Concat(nodeArgs, []string{"--tls-cluster", "yes", "--tls-replication", "yes"})...)
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	if certs != nil {
		cliArgs = []string{"--tls", "--cacert", certs.CAFile}
	}
	if masters < 3 {
		// redis-cli --cluster create wants 3 masters at least; a smaller
		// Cluster (1 master: the baseline of a capacity measurement) is
		// made by hand.
		if replicasPerMaster != 0 || certs != nil {
			tb.Fatalf("redistest: a Cluster of %d masters is made without replicas or TLS only", masters)
		}
		if err := c.assignSlots(); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
	} else {
		args := append(cliArgs, "--cluster", "create")
		args = append(args, c.Addrs...)
		args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
		if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
			tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
		}
	}
	opt := &redis.ClusterOptions{Addrs: c.Addrs}
	if certs != nil {
		opt.TLSConfig = certs.ClientConfig()
	}
	client := redis.NewClusterClient(opt)
	tb.Cleanup(func() { client.Close() })
	c.WaitHealthy(tb, client)
	if replicasPerMaster > 0 {
		c.waitReplicasSynced(tb)
	}
	return c, client
}

// assignSlots makes the Cluster's nodes (masters only) meet and splits the
// 16,384 slots between them in even ranges.
func (c *Cluster) assignSlots() error {
	ctx := context.Background()
	const slots = 16384
	for i, s := range c.Nodes {
		n := s.newClient()
		err := func() error {
			defer n.Close()
			if i > 0 {
				if err := n.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(c.Nodes[0].Port)).Err(); err != nil {
					return fmt.Errorf("CLUSTER MEET: %w", err)
				}
			}
			lo, hi := i*slots/len(c.Nodes), (i+1)*slots/len(c.Nodes)-1
			if err := n.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
				return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d: %w", lo, hi, err)
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// waitReplicasSynced waits until every replica's link to its master is up,
// so that a failover test starts from replicas that hold the data.
func (c *Cluster) waitReplicasSynced(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		n := s.newClient()
		for {
			info, err := n.Info(context.Background(), "replication").Result()
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				n.Close()
				tb.Fatalf("redistest: replica %s not in sync after 30s", s.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
		n.Close()
	}
}

// WaitHealthy waits until the cluster reports state ok on every running node
// and the client can write to every master.
func (c *Cluster) WaitHealthy(tb testing.TB, client *redis.ClusterClient) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	ctx := context.Background()
	for {
		ok := true
		for _, s := range c.Nodes {
			select {
			case <-s.done:
				continue
			default:
			}
			n := s.newClient()
			info, err := n.ClusterInfo(ctx).Result()
			n.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			client.ReloadState(ctx)
			err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.Ping(ctx).Err()
			})
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: cluster not healthy after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartReplica runs a redis-server replicating master (extra arguments as
// for Start) and waits until its link is up and it holds master's data; it
// is stopped when the test ends.
func StartReplica(tb testing.TB, master *Server, extra ...string) *Server {
	tb.Helper()
	m := master.newClient()
	err := m.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err() // sync at once, not after 5 s
	m.Close()
	if err != nil {
		tb.Fatalf("redistest: replica of %s: %v", master.Addr, err)
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	s := Start(tb, slices.Concat([]string{"--replicaof", host, port}, extra)...)
	s.waitLink(tb, true)
	return s
}

// BreakReplication cuts the link of s, a replica of master, and keeps it
// cut: master drops its replica connections and s's handshakes fail (a wrong
// masterauth), so writes on master from now on reach no replica — what a
// master's crash loses under Redis's asynchronous replication. The replica
// keeps what it had. MendReplication undoes it.
func (s *Server) BreakReplication(tb testing.TB, master *Server) {
	tb.Helper()
	ctx := context.Background()
	c, m := s.newClient(), master.newClient()
	defer c.Close()
	defer m.Close()
	if err := c.ConfigSet(ctx, "masterauth", "redistest-wrong-password").Err(); err != nil {
		tb.Fatalf("redistest: break replication: %v", err)
	}
	if err := m.Do(ctx, "client", "kill", "type", "replica").Err(); err != nil {
		tb.Fatalf("redistest: break replication: %v", err)
	}
	s.waitLink(tb, false)
}

// MendReplication lets s, a replica whose link BreakReplication cut,
// reconnect, and waits until the link is up (Redis retries every second).
func (s *Server) MendReplication(tb testing.TB) {
	tb.Helper()
	c := s.newClient()
	defer c.Close()
	if err := c.ConfigSet(context.Background(), "masterauth", "").Err(); err != nil {
		tb.Fatalf("redistest: mend replication: %v", err)
	}
	s.waitLink(tb, true)
}

// WaitSynced waits until s is a replica whose link to its master is up
// (e.g. an old master restarted after a failover, rejoining as a replica).
func (s *Server) WaitSynced(tb testing.TB) {
	tb.Helper()
	s.waitLink(tb, true)
}

// waitLink waits until s's master_link_status is up (or down).
func (s *Server) waitLink(tb testing.TB, up bool) {
	tb.Helper()
	c := s.newClient()
	defer c.Close()
	want := "master_link_status:down"
	if up {
		want = "master_link_status:up"
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: replica %s: no %s after 30s (%v)", s.Addr, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ReplicaOf returns the running node of the cluster that replicates master.
func (c *Cluster) ReplicaOf(tb testing.TB, master *Server) *Server {
	tb.Helper()
	host, port, _ := net.SplitHostPort(master.Addr)
	for _, s := range c.Nodes {
		if s == master || !s.Running() {
			continue
		}
		n := s.newClient()
		info, err := n.Info(context.Background(), "replication").Result()
		n.Close()
		if err == nil && strings.Contains(info, "master_host:"+host+"\r\n") && strings.Contains(info, "master_port:"+port+"\r\n") {
			return s
		}
	}
	tb.Fatalf("redistest: no running replica of %s", master.Addr)
	return nil
}

// Node returns the cluster's server listening on addr.
func (c *Cluster) Node(tb testing.TB, addr string) *Server {
	tb.Helper()
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	tb.Fatalf("redistest: no cluster node at %s", addr)
	return nil
}

// Running reports whether the server's process has not exited.
func (s *Server) Running() bool {
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Overfill puts the server over its memory limit, as another application
// filling it would: it writes 2 MiB of values without a TTL (keys
// redistest:fill:N) and sets maxmemory 1 MiB below the memory then in use.
// Under maxmemory-policy noeviction Redis refuses every write that could
// grow memory until the values are gone; free deletes them.
func (s *Server) Overfill(tb testing.TB) (free func()) {
	tb.Helper()
	ctx := context.Background()
	c := s.newClient()
	defer c.Close()
	v := strings.Repeat("x", 256<<10)
	var keys []string
	for i := 0; i < 16; i++ { // 4 MiB, which free deletes
		keys = append(keys, "redistest:fill:"+strconv.Itoa(i))
		if err := c.Set(ctx, keys[i], v, 0).Err(); err != nil {
			tb.Fatalf("redistest: overfill: %v", err)
		}
	}
	// maxmemory 2 MiB under what Redis uses now. Its use moves a little
	// between the read and the write (client buffers; a loaded suite once
	// saw it drop by more than 1 MiB): read again and lower again until a
	// write is refused.
	var err error
	for try := 0; try < 5; try++ {
		var info string
		if info, err = c.Info(ctx, "memory").Result(); err != nil {
			tb.Fatalf("redistest: overfill: %v", err)
		}
		used, _ := strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
		if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-2<<20, 10)).Err(); err != nil {
			tb.Fatalf("redistest: overfill: %v", err)
		}
		if err = c.Set(ctx, "redistest:probe", "x", 0).Err(); err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
	}
	if err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		tb.Fatalf("redistest: overfill: Redis still takes writes (%v); is maxmemory-policy noeviction?", err)
	}
	return func() {
		c := s.newClient()
		defer c.Close()
		if err := c.Del(ctx, keys...).Err(); err != nil {
			tb.Errorf("redistest: free: %v", err)
		}
	}
}

// infoField is one field of an INFO reply ("" when absent).
func infoField(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return ""
}

// Freeze stops the server's process (SIGSTOP) without closing its
// connections: a frozen replica stays connected to its master but
// acknowledges nothing. Thaw resumes it; the test's end does too.
func (s *Server) Freeze(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("redistest: freeze %s: %v", s.Addr, err)
	}
	tb.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		tb.Fatalf("redistest: thaw %s: %v", s.Addr, err)
	}
}
