package main

import (
	"fmt"
	"io"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
)

// printBreaker is gate status's line about the provider's circuit breaker (providers.<name>.breaker).
func printBreaker(w io.Writer, b *report.Breaker, now time.Time) {
	if b == nil {
		return
	}
	st := b.Gate
	opened := fmt.Sprintf("opened %d times", st.Opened)
	if st.Opened == 1 {
		opened = "opened once"
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	switch b.State {
	case "off":
		fmt.Fprintln(w, "breaker: off (breaker.failures: 0)")
	case gate.BreakerClosed.String():
		fmt.Fprintf(w, "breaker: closed, %d of %d transient failures in a row (%s)\n", b.Failures, b.Threshold, opened)
	case gate.BreakerOpen.String():
		fmt.Fprintf(w, "breaker: open, nothing sent; probe at %s (in %s), open for %s of at most %s (%s)\n", b.ProbeAt,
			max(st.Until.Sub(now), 0).Round(time.Millisecond), ms(b.OpenForMs), ms(b.OpenMaxMs), opened)
	case gate.BreakerProbing.String():
		fmt.Fprintf(w, "breaker: probing, job %q is the one request let through; its answer is due by %s (in %s); open for %s (%s)\n",
			b.Probe, b.ProbeBy, max(st.Until.Sub(now), 0).Round(time.Millisecond), ms(b.OpenForMs), opened)
	}
}

// printBreakers is check-config's line per provider about its circuit breaker (providers.<name>.breaker).
func printBreakers(w io.Writer, c *config.Config) {
	for _, name := range c.ProviderNames() {
		b := c.Providers[name].Breaker
		if b.Threshold() == 0 {
			fmt.Fprintf(w, "%s: breaker off (breaker.failures: 0): transient failures are retried until max_attempts\n", name)
			continue
		}
		fmt.Fprintf(w, "%s: breaker opens after %d transient failures in a row across the fleet; probe after %s, doubling up to %s\n",
			name, b.Threshold(), b.OpenFor, b.OpenMax)
	}
}
