//go:build unix

package fakes

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// holdPort keeps addr's TCP port bound, without listening on it, until
// the returned Closer is closed. A connection to it is refused, as to a
// provider whose front end is gone, and no other listener — another
// parallel test's, asking the kernel for any free port — can take it
// meanwhile and answer in the fake's place (a freed loopback port comes
// back to a bind of port 0 about once in 5,000 binds; a bound socket is
// skipped). Listening on the port again explicitly works while it is held.
func holdPort(addr string) (io.Closer, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	family, sa := syscall.AF_INET, syscall.Sockaddr(nil)
	if ip4 := a.IP.To4(); ip4 != nil {
		sa = &syscall.SockaddrInet4{Port: a.Port, Addr: [4]byte(ip4)}
	} else {
		family, sa = syscall.AF_INET6, &syscall.SockaddrInet6{Port: a.Port, Addr: [16]byte(a.IP.To16())}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return nil, fmt.Errorf("holding port %s: %w", addr, err)
	}
	syscall.CloseOnExec(fd)
	// SO_REUSEADDR: binds over the fake's own connections in TIME_WAIT,
	// and lets Up listen on the port before the hold is let go.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("holding port %s: %w", addr, err)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("holding port %s: %w", addr, err)
	}
	return os.NewFile(uintptr(fd), "port hold "+addr), nil
}
