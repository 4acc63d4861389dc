//go:build nodev

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// errNoDev: the production build (-tags nodev) leaves the dev mode out,
// and with it the in-process Redis (miniredis and its Lua interpreter).
var errNoDev = errors.New("sluice dev is not in this binary: it was built with -tags nodev (the production build, without the in-process Redis); run `go run ./cmd/sluice dev` from a checkout")

func newDevCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "dev",
		Short:  "Not in this build (-tags nodev): run `go run ./cmd/sluice dev` from a checkout",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE:   func(*cobra.Command, []string) error { return errNoDev },
		// Flags of the full dev mode are accepted so the error says why.
		DisableFlagParsing: true,
	}
}
