package pollgate

import "github.com/redis/go-redis/v9"

// Recognised reports whether the gate would answer cmd (given what it knows).
func (g *Gate) Recognised(cmd redis.Cmder) bool {
	_, ok := g.classify(cmd)
	return ok
}
