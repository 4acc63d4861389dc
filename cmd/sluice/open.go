package main

import (
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/services"
)

// readBase reads the shared settings from the environment, checking only
// that every value parses: a tool needs a few of them (enqueue needs Redis
// and the queue, not an SMTP server).
func readBase() (config.Base, error) {
	var b config.Base
	return b, config.Read(nil, &b)
}

// openTool reads the shared settings and opens what a tool works with:
// Redis, the limiter, the rules, and the payload keys when keys is true.
// The caller closes it.
func openTool(keys bool) (*services.Set, config.Base, error) {
	b, err := readBase()
	if err != nil {
		return nil, b, err
	}
	if err := b.Layout().Validate(); err != nil {
		return nil, b, err
	}
	d, err := services.Open(b, services.Options{NoKeys: !keys})
	return d, b, err
}
