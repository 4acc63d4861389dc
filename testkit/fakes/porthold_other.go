//go:build !unix

package fakes

import "io"

// holdPort does nothing here: the port is free while the fake is down.
func holdPort(string) (io.Closer, error) { return io.NopCloser(nil), nil }
