package proxy

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"sturdy/policy"
)

// Spend budgets (clients: spend, and a client key's own): a reply's usage
// priced at the table's prices (the model as sent) is added to its
// client's spend for the period (a UTC day or month) as the request ends;
// a client whose spend reached its budget is refused 429 budget_exceeded
// until the period ends. Spend is counted after each reply, not reserved:
// the replies in flight when a budget runs out may pass it.

// spent is a client's spend in its period, under a keyBudget.
type spent struct {
	mu     sync.Mutex
	period int64
	usd    float64
}

// periodOf is the number of the period (day or month, UTC) now falls in,
// and when it ends.
func periodOf(period string, now time.Time) (n int64, end time.Time) {
	now = now.UTC()
	if period == "month" {
		y, m, _ := now.Date()
		return int64(y)*12 + int64(m), time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	}
	day := now.Truncate(24 * time.Hour)
	return day.Unix() / 86400, day.Add(24 * time.Hour)
}

// in is what was spent in period n.
func (s *spent) in(n int64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.period != n {
		return 0
	}
	return s.usd
}

// add adds usd to period n.
func (s *spent) add(n int64, usd float64) {
	s.mu.Lock()
	if s.period != n {
		s.period, s.usd = n, 0
	}
	s.usd += usd
	s.mu.Unlock()
}

// spender is a client's spend a request adds its cost to as it ends.
type spender struct {
	s      *spent
	period string
}

// takeSpend admits ex's client under its spend budget o — its spend s so
// far this period under it — or refuses it 429 budget_exceeded until the
// period ends (who: whose).
func takeSpend(ex *exchange, s *spent, o Spend, now time.Time, who string) *apiError {
	n, end := periodOf(o.Period, now)
	if used := s.in(n); used >= o.USD {
		e := newError(CodeBudgetExceeded, fmt.Sprintf("%s has spent its budget of $%.2f a %s ($%.2f); it renews at %s",
			who, o.USD, o.Period, used, end.Format(time.RFC3339)))
		e.retryAfter = end.Sub(now)
		ex.out.outcome = outcomeRateLimited
		return e
	}
	ex.req.spenders = append(ex.req.spenders, spender{s: s, period: o.Period})
	return nil
}

// prices are a table's model prices, the most literal glob first.
type prices []struct {
	glob  string
	price Price
}

func buildPrices(ps map[string]Price) prices {
	var out prices
	for g, p := range ps {
		out = append(out, struct {
			glob  string
			price Price
		}{g, p})
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := policy.GlobSpecificity(out[i].glob), policy.GlobSpecificity(out[j].glob); a != b {
			return a > b
		}
		return out[i].glob < out[j].glob
	})
	return out
}

// cost is what u costs for model (as sent), in USD; 0 when no price
// names it.
func (ps prices) cost(model string, u policy.Usage) float64 {
	for _, p := range ps {
		if policy.GlobMatch(p.glob, model) {
			return (float64(u.Input)*p.price.Input + float64(u.Output)*p.price.Output) / 1e6
		}
	}
	return 0
}

// settleSpend adds the request's cost (its summary's) to every spend it
// was admitted under.
func settleSpend(ex *exchange, s *summary) {
	q := &ex.req
	if len(q.spenders) == 0 {
		return
	}
	now := time.Now()
	for _, sp := range q.spenders {
		n, _ := periodOf(sp.period, now)
		sp.s.add(n, s.cost)
	}
	q.spenders = q.spenders[:0]
}
