package upstream

import (
	"fmt"
	"testing"
	"time"

	"sturdy/breaker"
	"sturdy/internal/upstreamtest"
)

// TestDebugUpstreamsListsAtMost256ModelBreakers: an endpoint's reply
// breakers shown are bounded whatever the group holds.
func TestDebugUpstreamsListsAtMost256ModelBreakers(t *testing.T) {
	t.Parallel()
	srv := upstreamtest.Start(t, upstreamtest.Step{Body: "{}"})
	up := startUpstream(t, srv.URL)
	ep := up.Endpoints()[0]
	ep.models = breaker.NewGroup("up", breaker.GroupSettings{Max: 1000})
	for i := 0; i < 600; i++ {
		ep.models.Get(fmt.Sprint("model-", i), time.Now())
	}
	if n := len(up.Status(time.Now()).ModelBreakers); n != MaxListedModelBreakers {
		t.Fatalf("%d model breakers listed, want %d", n, MaxListedModelBreakers)
	}
}
