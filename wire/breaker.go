package wire

import (
	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gate"
)

// breakerOf is a provider's circuit breaker as the gate takes it (providers.<name>.breaker): the probe's
// holder has the max wait, the provider's timeout and LeaseSlack to report its answer (it may reserve a
// slot up to the max wait ahead, then waits for the answer), and the hold reaches the max wait past the
// moment a probe is due, so that a reserve while open is denied until then rather than reserved at the
// hold's end.
func breakerOf(c *config.Config, p config.Provider) gate.Breaker {
	b := p.Breaker
	if b.Threshold() == 0 {
		return gate.Breaker{}
	}
	return gate.Breaker{Failures: b.Threshold(), OpenFor: b.OpenFor, OpenMax: b.OpenMax,
		Probe: c.Worker.MaxInlineWait + p.Timeout + LeaseSlack, Reach: c.Worker.MaxInlineWait}
}
