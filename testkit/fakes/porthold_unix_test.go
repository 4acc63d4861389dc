//go:build unix

package fakes

import (
	"errors"
	"net"
	"net/url"
	"syscall"
	"testing"
)

// While the fake SMS API is down its port is refused and still bound, so
// no other listener can take it; Up serves on it again.
func TestSMSAPIDownHoldsItsPort(t *testing.T) {
	f := NewSMSAPI(t)
	u, err := url.Parse(f.URL)
	if err != nil {
		t.Fatal(err)
	}
	f.Down(t)
	if _, err := net.Dial("tcp", u.Host); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing the fake while down: %v, want connection refused", err)
	}
	a, err := net.ResolveTCPAddr("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: a.Port, Addr: [4]byte(a.IP.To4())}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding the down fake's port: %v, want EADDRINUSE (the port was let go)", err)
	}
	f.Up(t)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatalf("dialing the fake after Up: %v", err)
	}
	c.Close()
}
