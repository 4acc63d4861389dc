package dashboard

import (
	"net/http"
	"sync"
)

// Caps are the live streams one server serves at once.
type Caps struct {
	Total   int // in all
	Admin   int // of Total, those only the admin may take
	Tenant  int // one tenant's sessions together
	Session int // one session
}

// StreamShare is the share of SLUICE_API_MAX_CONNS live streams may hold
// together: at least three quarters of the connections always remain for
// requests, whatever the setting.
const StreamShare = 4

// StreamCaps derives the stream caps from the server's connection cap
// (SLUICE_API_MAX_CONNS; 0 reads as its default, 1024): a quarter of the
// connections at most, and never more than 64; an eighth of them (at
// least 1) for the admin alone; 8 for one tenant and 2 for one session, or
// what remains for tenants when that is less. At 1024: 64, 8, 8, 2; at
// 16 (the least allowed): 4, 1, 3, 2.
func StreamCaps(maxConns int) Caps {
	if maxConns <= 0 {
		maxConns = 1024
	}
	c := Caps{Total: min(64, max(2, maxConns/StreamShare))}
	c.Admin = max(1, c.Total/8)
	c.Tenant = min(8, c.Total-c.Admin)
	c.Session = min(2, c.Tenant)
	return c
}

// streamSlots shares the server's live streams fairly, by its Caps: one
// tenant's sessions can never take the admin's streams or another
// tenant's, and the streams together never hold more than a quarter of
// the server's connections.
type streamSlots struct {
	caps      Caps
	mu        sync.Mutex
	total     int
	tenants   int // streams of tenant sessions
	byTenant  map[string]int
	bySession map[string]int
	ends      map[string]map[*int]func() // by session nonce: each open stream's end
}

func newStreamSlots(c Caps) *streamSlots {
	return &streamSlots{caps: c, byTenant: map[string]int{}, bySession: map[string]int{}, ends: map[string]map[*int]func(){}}
}

// endSession ends every open stream of the session with nonce at once (a
// sign-out on this server; other servers notice at their next tick).
func (p *streamSlots) endSession(nonce string) {
	p.mu.Lock()
	ends := p.ends[nonce]
	delete(p.ends, nonce)
	p.mu.Unlock()
	for _, end := range ends {
		end()
	}
}

// take reserves a stream for s, which end ends (a sign-out calls it);
// release (nil when refused) gives the slot back. A refusal says why,
// with its status: 429 for the session's or tenant's own share, 503 when
// the server's are all taken.
func (p *streamSlots) take(s uiSession, end func()) (release func(), status int, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.bySession[s.Nonce] >= p.caps.Session:
		return nil, http.StatusTooManyRequests, "this sign-in has its live streams open already (close another tab)"
	case !s.Admin && p.byTenant[s.Tenant] >= p.caps.Tenant:
		return nil, http.StatusTooManyRequests, "this tenant has its live streams open already"
	case !s.Admin && p.tenants >= p.caps.Total-p.caps.Admin, p.total >= p.caps.Total:
		return nil, http.StatusServiceUnavailable, "too many live streams"
	}
	p.total++
	p.bySession[s.Nonce]++
	if !s.Admin {
		p.tenants++
		p.byTenant[s.Tenant]++
	}
	id := new(int)
	if p.ends[s.Nonce] == nil {
		p.ends[s.Nonce] = map[*int]func(){}
	}
	p.ends[s.Nonce][id] = end
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if m := p.ends[s.Nonce]; m != nil {
				if delete(m, id); len(m) == 0 {
					delete(p.ends, s.Nonce)
				}
			}
			p.total--
			if p.bySession[s.Nonce]--; p.bySession[s.Nonce] == 0 {
				delete(p.bySession, s.Nonce)
			}
			if !s.Admin {
				p.tenants--
				if p.byTenant[s.Tenant]--; p.byTenant[s.Tenant] == 0 {
					delete(p.byTenant, s.Tenant)
				}
			}
		})
	}, 0, ""
}
