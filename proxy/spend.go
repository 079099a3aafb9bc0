package proxy

import (
	"fmt"
	"sync"
	"time"
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

// spender is a client's spend a request adds its cost to as it ends:
// this replica's (s), and the fleet's (name) when shared_state is set.
type spender struct {
	s      *spent
	period string
	fleet  *shared
	name   string
}

// takeSpend admits ex's client under its spend budget o — what it spent
// this period: the fleet's when f is set (name: its budget there; when
// Redis does not answer and on_failure is local, this replica's, against
// the budget ÷ the replicas the fleet last counted), else this replica's
// (s) — or refuses it 429 budget_exceeded until the period ends (who:
// whose).
func takeSpend(ex *exchange, s *spent, o Spend, f *shared, name string, now time.Time, who string) *apiError {
	n, end := periodOf(o.Period, now)
	used, budget := s.in(n), o.USD
	if f != nil {
		switch v, why := f.spent(name, n); {
		case why != "" && f.opts.Refuse:
			ex.out.outcome = outcomeSharedState
			return sharedFailure(why)
		case why != "":
			budget /= float64(f.st.Replicas())
		default:
			used = v
		}
	}
	if used >= budget {
		e := newError(CodeBudgetExceeded, fmt.Sprintf("%s has spent its budget of $%.2f a %s ($%.2f); it renews at %s",
			who, o.USD, o.Period, used, end.Format(time.RFC3339)))
		e.retryAfter = end.Sub(now)
		ex.out.outcome = outcomeRateLimited
		return e
	}
	ex.req.spenders = append(ex.req.spenders, spender{s: s, period: o.Period, fleet: f, name: name})
	return nil
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
		n, end := periodOf(sp.period, now)
		sp.s.add(n, s.cost)
		if sp.fleet != nil && s.cost > 0 {
			sp.fleet.st.AddSpend(sp.name, n, s.cost, end)
		}
	}
	q.spenders = q.spenders[:0]
}
