package e2e

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// freeAddr returns a loopback address for a sluice process to listen on:
// a port that was free a moment ago, below the kernel's range of ephemeral
// ports, and not given out before by this process.
//
// Below that range because the port is closed again before the process
// binds it, seconds later under load, and meanwhile any outgoing connection
// on the machine (the tests' Redis clients, the fakes', the workers') may be
// given it as its local port: a full run beside two CPU hogs once saw a
// worker's /readyz never answer for 10 s. The kernel hands out ephemeral
// ports only from its range, so a port below it is taken only by a listener
// that asks for it by number.
func freeAddr(t *testing.T) string {
	t.Helper()
	addrMu.Lock()
	defer addrMu.Unlock()
	low := ephemeralLow()
	for range 1000 {
		port := addrFloor + rand.IntN(low-addrFloor)
		if addrGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // someone's, now
		}
		addr := l.Addr().String()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		addrGiven[port] = true
		return addr
	}
	t.Fatalf("no free loopback port in %d-%d", addrFloor, low-1)
	return ""
}

// addrFloor is the lowest port freeAddr gives: above the well-known and
// most registered services' ports.
const addrFloor = 20000

var (
	addrMu    sync.Mutex
	addrGiven = map[int]bool{}
)

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux:
// net.ipv4.ip_local_port_range), or Linux's default, 32768, where it cannot
// be read or starts too low to leave freeAddr room (there freeAddr's ports
// are no longer safe from the race it avoids, only rarer).
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return linuxDefault
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < addrFloor+1000 {
		return linuxDefault
	}
	return n
}
