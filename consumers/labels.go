package consumers

// The values the core's metrics and its log lines name: a public contract (docs/operations.md lists them,
// dashboards and alerts select on them). A value once published is never renamed.

// Decision is what the worker made of the gate's answer for a job: the decision label of
// paygate_gate_decisions_total, and (allowed, reserved, duplicate, redelivered) the admission field of
// the job's settled line.
type Decision string

// The decisions.
const (
	DecisionAllowed        Decision = "allowed"        // admitted now
	DecisionReserved       Decision = "reserved"       // admitted at a slot ahead, slept on in-process
	DecisionDuplicate      Decision = "duplicate"      // the id was admitted already: a redelivery, sent on that admission (gate.Verdict.Duplicate)
	DecisionRedelivered    Decision = "redelivered"    // the id's stale entry was admitted afresh at a new slot (gate.Verdict.Moved)
	DecisionDenied         Decision = "denied"         // no slot within max wait: waited out in-process, or the job deferred
	DecisionLate           Decision = "late"           // woke more than the late limit after its slot: the slot given back, asked again
	DecisionLost           Decision = "lost"           // the gate's state may have been lost under the slot: given up, asked again
	DecisionRelimited      Decision = "relimited"      // the live limits changed under the slot: given up, asked again
	DecisionUnacknowledged Decision = "unacknowledged" // an admission or a move not on enough replicas (redis.min_replicas_acked)
	DecisionError          Decision = "error"          // the gate could not answer, or refused the request as invalid
	DecisionPostponed      Decision = "postponed"      // a late wake-up sent at once, its unit moved to then (gate.Limiter.Postpone)
	DecisionDeparted       Decision = "departed"       // a request written late, recorded where it went (gate.Limiter.Departed)
	DecisionWouldDelay     Decision = "would_delay"    // shadow mode: an enforcing worker would have slept on the slot
	DecisionWouldDeny      Decision = "would_deny"     // shadow mode: an enforcing worker would have deferred the job
	DecisionBreakerOpen    Decision = "breaker_open"   // the provider's breaker held the job: waited in-process, or deferred (breaker.go)
	DecisionProbe          Decision = "probe"          // the job took the provider's breaker's probe: it goes through the breaker's hold
	DecisionCancelled      Decision = "cancelled"      // the job was cancelled: denied by the gate, or its slot given up when told
)

// Outcome is how a delivery was settled: the outcome label of paygate_jobs_total and
// paygate_merchant_jobs_total, and the outcome field of the job's settled line. (The class of a provider's
// answer, paygate_dispatch_duration_seconds's label, is providers.Outcome.)
type Outcome string

// The outcomes.
const (
	OutcomeSucceeded      Outcome = "succeeded"      // the provider accepted it: acked
	OutcomeDeclined       Outcome = "declined"       // the provider declined the payment (declined_when): acked, final
	OutcomeThrottled      Outcome = "throttled"      // the provider answered 429: deferred by its Retry-After (not an attempt)
	OutcomeTransient      Outcome = "transient"      // a failure that may pass: deferred by backoff (an attempt)
	OutcomePermanent      Outcome = "permanent"      // the provider refused it (4xx): dead letter
	OutcomeExhausted      Outcome = "exhausted"      // transient failures reached max_attempts: dead letter
	OutcomeInvalid        Outcome = "invalid"        // not a valid job, or one the gate refuses: dead letter
	OutcomeTooOld         Outcome = "too_old"        // first seen longer ago than max_deferral_age: dead letter
	OutcomeDeferred       Outcome = "deferred"       // no slot within max wait: deferred by the gate's RetryAfter
	OutcomeScheduled      Outcome = "scheduled"      // before its not_before: deferred, asking the gate nothing
	OutcomeUnrecorded     Outcome = "unrecorded"     // its result not published: deferred, sent again later
	OutcomePaused         Outcome = "paused"         // the provider is paused, or the slot falls in a pause: deferred past it
	OutcomeLate           Outcome = "late"           // woke late on every one of MaxLateTries slots: deferred, never sent late
	OutcomeLost           Outcome = "lost"           // the gate's state was lost under every one of MaxLateTries slots: deferred
	OutcomeRelimited      Outcome = "relimited"      // the live limits changed under every one of MaxLateTries slots: deferred
	OutcomeGateError      Outcome = "gate_error"     // the gate could not answer: deferred (fail closed)
	OutcomeUnacknowledged Outcome = "unacknowledged" // an admission or a move not on enough replicas: deferred
	OutcomeRequeued       Outcome = "requeued"       // shutting down: handed back to the queue untouched
	OutcomeBreakerOpen    Outcome = "breaker_open"   // the provider's breaker is open: deferred until its probe (not an attempt)
	OutcomeCancelled      Outcome = "cancelled"      // cancelled (worker cancel): acked, never sent
	OutcomeProbeFailed    Outcome = "probe_failed"   // the job was the breaker's probe and failed: deferred until the next probe (not an attempt)
)
