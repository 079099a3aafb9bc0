package proxy

import (
	"fmt"
	"sort"
	"time"

	"sturdy/breaker"
	"sturdy/upstream"
)

// status reports the state of every upstream of the table at now (see
// Proxy.Upstreams).
func (t *table) status(now time.Time) []upstream.Status {
	var out []upstream.Status
	for _, up := range t.upstreams {
		out = append(out, up.Status(now))
	}
	return out
}

// unready names the routes of the table that have no target with an
// endpoint that is in (half-open counts as in: probes go through).
func (t *table) unready() (notReady []string) {
	for _, r := range t.routes {
		ready := false
		for _, tg := range r.targets {
			if tg.up.State() != breaker.StateOpen {
				ready = true
				break
			}
		}
		if !ready {
			notReady = append(notReady, r.name)
		}
	}
	return notReady
}

// refreshGauges brings every upstream's per-endpoint gauges up to date
// (upstream.RefreshGauges).
func (t *table) refreshGauges() {
	for _, up := range t.upstreams {
		up.RefreshGauges()
	}
}

// ClientBudgets is a page of /debug/clients: the clients holding token
// budgets on this replica, the most used first.
type ClientBudgets struct {
	// Total is how many clients hold budgets; Page (from 1) and PerPage
	// say which of them Clients are.
	Total   int            `json:"total"`
	Page    int            `json:"page"`
	PerPage int            `json:"per_page"`
	Clients []ClientBudget `json:"clients"`
	// Fleet says the budgets are the fleet's (shared_state): what is
	// listed is this replica's own windows, used while Redis is down.
	Fleet bool `json:"fleet"`
}

// ClientBudget is one client's token budgets: whose entry they are
// (clients[i], or client_keys_file for a key's own), the
// client's id (its key's SHA-256, the first 12 hex digits: never the
// key), each budget, and its use (the largest share of a limit spent or
// held, ‰).
type ClientBudget struct {
	Entry   string               `json:"entry"`
	Key     string               `json:"key_sha256_prefix"`
	Use     int64                `json:"use_permille"`
	Budgets []ClientBudgetWindow `json:"budgets"`
}

// ClientBudgetWindow is one budget of a client: its kind (tokens, input
// tokens, output tokens), limit, what remains (negative: a debt), what
// requests in flight hold, and when what it holds has left it.
type ClientBudgetWindow struct {
	Kind      string `json:"kind"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Reserved  int64  `json:"reserved"`
	ResetMS   int64  `json:"reset_ms"`
}

// MaxClientsPerPage bounds a page of /debug/clients.
const MaxClientsPerPage = 500

// clientBudgets is page page (from 1) of perPage (at most
// MaxClientsPerPage) of the clients holding token budgets in the table
// at now, the most used first (see Proxy.Clients; fleet: shared_state is
// set).
func (t *table) clientBudgets(now time.Time, page, perPage int, fleet bool) ClientBudgets {
	perPage = min(max(perPage, 1), MaxClientsPerPage)
	page = min(max(page, 1), 1<<30/MaxClientsPerPage) // past every client, and (page-1)·perPage cannot overflow
	var all []ClientBudget
	list := func(entry string, cl *clientLimiter) {
		if cl.budgets == nil {
			return
		}
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for _, b := range cl.budgets.Values() {
			c := ClientBudget{Entry: entry, Key: b.id}
			for k := range tokenKinds {
				if limit := cl.opts.limit(k); limit > 0 {
					st := b.w[k].State(now)
					c.Budgets = append(c.Budgets, ClientBudgetWindow{Kind: tokenKindNames[k], Limit: st.Limit,
						Remaining: st.Remaining, Reserved: st.Reserved, ResetMS: st.Reset.Milliseconds()})
					c.Use = max(c.Use, (st.Limit-st.Remaining)*1000/max(st.Limit, 1))
				}
			}
			all = append(all, c)
		}
	}
	for i, cl := range t.clients {
		list(fmt.Sprintf("clients[%d]", i), cl)
	}
	seen := map[*clientLimiter]bool{}
	for _, k := range t.keys {
		if k.limit != nil && !seen[k.limit] {
			seen[k.limit] = true
			list("client_keys_file", k.limit)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Use > all[j].Use })
	out := ClientBudgets{Total: len(all), Page: page, PerPage: perPage, Fleet: fleet, Clients: []ClientBudget{}}
	if from := (page - 1) * perPage; from < len(all) {
		out.Clients = all[from:min(from+perPage, len(all))]
	}
	return out
}
