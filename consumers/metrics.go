package consumers

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// Metrics are the core's Prometheus series.
type Metrics struct {
	jobs      *prometheus.CounterVec   // paygate_jobs_total{provider,outcome}
	gateWait  *prometheus.HistogramVec // paygate_gate_wait_seconds{provider}
	decisions *prometheus.CounterVec   // paygate_gate_decisions_total{provider,decision}
	dispatch  *prometheus.HistogramVec // paygate_dispatch_duration_seconds{provider,class}
	inflight  *prometheus.GaugeVec     // paygate_inflight{provider}
	lateness  *prometheus.HistogramVec // paygate_dispatch_lateness_seconds{provider}
	margin    *prometheus.GaugeVec     // paygate_gate_margin_seconds{provider}
	// paygate_merchant_jobs_total{provider,merchant,outcome}: providers with fair shares only; merchant
	// is a merchant named in the configuration, "_other" for the rest, "_none" for jobs without one, so
	// that the series stay as few as the configuration's names
	merchantJobs *prometheus.CounterVec
	results      *prometheus.CounterVec // paygate_results_total{provider,outcome}
	// paygate_breaker_state{provider}: 0 closed, 1 open, 2 probing, as this worker last learned it;
	// paygate_breaker_opened_total{provider}: openings (and reopenings) this worker's reports made
	breaker       *prometheus.GaugeVec
	breakerOpened *prometheus.CounterVec
	// paygate_priority_jobs_total{provider,priority,outcome}: jobs settled by class (the class of the
	// queue or topic they arrived on); paygate_priority_gate_calls_total{provider,priority}: the gate's
	// reserve calls by class, so that calls per job show (priority.go)
	classJobs  *prometheus.CounterVec
	classCalls *prometheus.CounterVec
}

// NewMetrics creates the series and registers them with reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_jobs_total", Help: "Jobs settled, by provider and outcome.",
		}, []string{"provider", "outcome"}),
		gateWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "paygate_gate_wait_seconds", Help: "Time a job waited in-process for its reserved slot.",
			Buckets: []float64{0, .001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"provider"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_gate_decisions_total", Help: "Gate decisions: allowed, reserved, duplicate, redelivered, denied, late, lost, relimited, unacknowledged, error, postponed (a late wake-up sent at once, its unit moved to then), departed (a request written late, recorded where it went).",
		}, []string{"provider", "decision"}),
		dispatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "paygate_dispatch_duration_seconds", Help: "Provider request duration, by outcome class.",
			Buckets: prometheus.DefBuckets,
		}, []string{"provider", "class"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paygate_inflight", Help: "Jobs being handled.",
		}, []string{"provider"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "paygate_dispatch_lateness_seconds",
			Help:    "How long after its reserved slot a job's request started; kept under half the margin in force.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, 1},
		}, []string{"provider"}),
		classJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_priority_jobs_total", Help: "Jobs settled, by provider, priority class (high, normal, low) and outcome.",
		}, []string{"provider", "priority", "outcome"}),
		classCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_priority_gate_calls_total", Help: "The gate's reserve calls for jobs, by provider and priority class (high, normal, low).",
		}, []string{"provider", "priority"}),
		merchantJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_merchant_jobs_total",
			Help: "Jobs settled by merchant, for providers with fair shares: a merchant named in the configuration, _other, or _none.",
		}, []string{"provider", "merchant", "outcome"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_results_total", Help: "Results published (results.enabled), by provider and outcome: succeeded, declined, dead.",
		}, []string{"provider", "outcome"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paygate_breaker_state", Help: "The provider's circuit breaker (providers.<name>.breaker) as this worker last learned it: 0 closed, 1 open, 2 probing.",
		}, []string{"provider"}),
		breakerOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paygate_breaker_opened_total", Help: "Times the provider's breaker opened or reopened on this worker's report (summed over the fleet: every opening once).",
		}, []string{"provider"}),
		margin: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paygate_gate_margin_seconds", Help: "The gate's margin in force, as this worker last learned it (its lateness report each second, a throttle report).",
		}, []string{"provider"}),
	}
	if reg != nil {
		reg.MustRegister(m.jobs, m.gateWait, m.decisions, m.dispatch, m.inflight, m.lateness, m.margin, m.merchantJobs, m.results, m.breaker, m.breakerOpened, m.classJobs, m.classCalls)
	}
	return m
}

// Touch creates a provider's series at zero, so dashboards and alerts see them before the first job.
func (m *Metrics) Touch(provider string) {
	m.jobs.WithLabelValues(provider, string(OutcomeSucceeded))
	m.gateWait.WithLabelValues(provider)
	m.decisions.WithLabelValues(provider, string(DecisionAllowed))
	m.dispatch.WithLabelValues(provider, string(providers.Succeeded))
	m.inflight.WithLabelValues(provider)
	m.lateness.WithLabelValues(provider)
	m.results.WithLabelValues(provider, ResultSucceeded) // 0 while results.enabled is off
	for _, c := range job.Priorities {
		m.classJobs.WithLabelValues(provider, string(c), string(OutcomeSucceeded))
		m.classCalls.WithLabelValues(provider, string(c))
	}
}

// decided counts a decision of the worker on a gate's answer for provider.
func (m *Metrics) decided(provider string, d Decision) {
	m.decisions.WithLabelValues(provider, string(d)).Inc()
}

// Tier picks the delay tier for a wait: the smallest tier >= d, else the largest (a job whose wait is
// longer comes back, asks again, and is deferred again). tiers must be sorted ascending and non-empty.
func Tier(tiers []time.Duration, d time.Duration) time.Duration {
	for _, t := range tiers {
		if t >= d {
			return t
		}
	}
	return tiers[len(tiers)-1]
}

// TierName is a tier's name in queue and topic names: 1s, 30s, 2m, 1h, 1500ms.
func TierName(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return itoa(int64(d/time.Hour)) + "h"
	case d%time.Minute == 0:
		return itoa(int64(d/time.Minute)) + "m"
	case d%time.Second == 0:
		return itoa(int64(d/time.Second)) + "s"
	default:
		return itoa(d.Milliseconds()) + "ms"
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
