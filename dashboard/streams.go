package dashboard

import (
	"net/http"
	"sync"
)

// streamSlots shares the server's live streams fairly: at most
// uiMaxStreams in all, of which uiAdminStreams only the admin may take;
// at most uiTenantStream for one tenant's sessions together and
// uiSessionStrm for one session. One tenant's sessions can therefore
// never take the admin's streams or another tenant's.
type streamSlots struct {
	mu        sync.Mutex
	total     int
	tenants   int // streams of tenant sessions
	byTenant  map[string]int
	bySession map[string]int
	ends      map[string]map[*int]func() // by session nonce: each open stream's end
}

func newStreamSlots() *streamSlots {
	return &streamSlots{byTenant: map[string]int{}, bySession: map[string]int{}, ends: map[string]map[*int]func(){}}
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
	case p.bySession[s.Nonce] >= uiSessionStrm:
		return nil, http.StatusTooManyRequests, "this sign-in has its live streams open already (close another tab)"
	case !s.Admin && p.byTenant[s.Tenant] >= uiTenantStream:
		return nil, http.StatusTooManyRequests, "this tenant has its live streams open already"
	case !s.Admin && p.tenants >= uiMaxStreams-uiAdminStreams, p.total >= uiMaxStreams:
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
