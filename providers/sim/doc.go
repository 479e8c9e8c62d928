// Package sim is a strict payment-provider stand-in: the referee that the demo, the tests and the
// benchmarks hold paygate to. It never imports the gate. The binary serves it as worker provider-sim.
//
// It enforces every window exactly, with its own clock, over the requests it accepted: a request that
// would take any window over its limit gets 429 with Retry-After and counts as a violation (it is not
// accepted). It deduplicates by the idempotency header: a key seen before gets the stored response and
// counts as a duplicate, never as a second charge. Injected faults (500s, hung requests) are counted
// apart. GET /stats reports it all as JSON; GET /keys lists the keys accepted (GET /accepted, with when
// each arrived); POST /faults changes the injected faults while it runs (a 429 storm, an outage, a
// latency, error rates); POST /limits changes its limits.
//
// # worker provider-sim
//
//	worker provider-sim --listen ADDR --limits SPEC [--latency D] [--jitter D] [--error-rate F] [--timeout-rate F]
//	                    [--idempotency-header H] [--seed N] [--max-in-flight N] [--headers ietf|x-ratelimit|none]
//	                    [--merchant-limits SPEC] [--merchant-header H] [--calendar]
//	                    [--oauth2 ID:SECRET [--token-ttl D]] [--hmac-secret KEY] [--tls-cert F --tls-key F [--client-ca F]]
//
// Its flags and what the simulator does with each request:
//
//   - SPEC is comma-separated N/duration windows: 100/1s,3000/1m. Every window is enforced exactly, with
//     the simulator's own clock, over the requests it accepted: a request that would take any window over
//     its limit gets 429 with Retry-After (whole seconds, rounded up) and counts as a violation; it is not
//     accepted.
//   - Requests are deduplicated by the idempotency header: a key seen before gets the stored response and
//     counts as a duplicate, never as a second charge. A request without the header is a 400.
//   - --error-rate answers that share of requests 500; --timeout-rate makes that share hang until the
//     client gives up. Neither is accepted or charged; both count in errors_injected (hangs also in
//     timeouts_injected). --seed makes them reproducible.
//   - --max-in-flight N (0, the default: no cap) caps the payment requests in flight at once. A request is
//     in flight from the moment it is received until its answer is written (latency included; a hung
//     one until the client gives up). One that would make more than N in flight is answered at once,
//     before anything else is decided (even a known key), with 429, Retry-After: 1 and
//     {"error":"concurrency limit exceeded","max_in_flight":N}. It is not accepted, not stored under its
//     key (a retry is a new request), and counts in throttled_in_flight, not in violations: violations
//     stay the rate-limit violations, so a fleet that keeps both caps keeps both counters at 0. A
//     concurrency 429 starts no quiet period for early_after_429 (a slot frees as soon as a request
//     ends). During an outage (down_for) requests are neither capped nor counted in flight.
//   - --merchant-limits SPEC enforces windows per merchant on top of --limits, keyed by the request's
//     --merchant-header (default X-Merchant, what paygate sends: providers.<name>.merchant_header); a
//     request without it counts against --limits only. A request that would take its merchant's window
//     over its limit gets 429 with Retry-After, is not accepted, and counts in merchant_violations (not
//     in violations, and it starts no quiet period: it is one merchant's 429). /stats adds
//     merchant_windows (max_in_window: the most any one merchant had in a window) and merchants (how many
//     had a request accepted).
//   - --calendar counts every window as calendar windows of Unix time, [k*W, (k+1)*W), as a provider with
//     a counter that resets at :00 does (fixed_window's referee); a 429 then asks to come back at the
//     next window's start. Without it windows slide: any interval of their length.
//
// For example:
//
//	$ worker provider-sim --listen 127.0.0.1:8081 --limits 3/2s &
//	$ for k in a b c d e a; do curl -s -o /dev/null -w "%{http_code} " -X POST -H "Idempotency-Key: $k" localhost:8081/pay; done
//	200 200 200 429 429 200
//
// # GET /stats
//
//	{"requests":6,"accepted":3,"duplicates":1,"violations":2,"errors_injected":0,"timeouts_injected":0,
//	 "bad_requests":0,"throttled_injected":0,"down_refused":0,"throttled_in_flight":0,"in_flight":0,
//	 "max_in_flight_seen":1,"early_after_429":0,
//	 "first_accepted":"2026-11-22T08:07:10.532597564Z","last_accepted":"…",
//	 "windows":[{"limit":3,"per":"2s","max_in_window":3}],
//	 "overs":[{"at":"2026-11-22T08:07:10.61Z","limit":3,"per":"2s","early":"1.92s"},…]}
//
// max_in_window is the largest number of accepted requests seen in any interval of that window's length.
//
// overs records the first 16 violations, for a post-mortem: when each arrived, the limit it would have
// exceeded (the one it exceeded by most), and how much later it would have fitted.
//
// in_flight is the number of payment requests in flight now, max_in_flight_seen the highest it has been,
// kept with or without --max-in-flight (with it, at most N: a request refused over the cap is never in
// flight). throttled_in_flight counts the 429s for concurrency.
//
// early_after_429 counts payment requests that arrived while a Retry-After the simulator gave (for a
// violation or in a storm) was still running, more than 250ms after the first 429 of that quiet period
// (requests already on the wire): a fleet that pauses together keeps it at 0.
//
// # GET /keys
//
// GET /keys lists the idempotency keys accepted (charged), each once: the tests' ledger reads it.
//
// # GET /accepted
//
// GET /accepted gives when each accepted key arrived, on the simulator's clock, as a JSON object
// ({"job-1":"2026-11-25T02:50:01.020312Z",…}): set beside the gate's slots, it says how long after its
// slot each request reached the provider (the fleet benchmark's "arrival after slot").
//
// # POST /faults
//
// POST /faults replaces the injected faults while it runs (the fault suite uses it); unknown keys are a
// 400:
//
//	{"error_rate":0.2,"timeout_rate":0,"latency":"2s","throttle_for":"6s","retry_after":"2s","down_for":"60s"}
//
// throttle_for is a 429 storm: every payment request is answered 429 with Retry-After: retry_after and
// is not charged (throttled_injected). down_for is an outage: every payment request has its connection
// closed without an answer (down_refused). refuse_for is the provider's process down: the simulator
// stops listening, so that connections are refused (nothing reaches it, nothing is counted), closes each
// connection it holds as soon as it is idle (the POST /faults that began it is answered first; its own
// endpoints are refused too meanwhile), and listens on the same address again when it ends (the server
// Start runs: worker provider-sim). Faults given beside it (error_rate) hold once it ends. Each lasts
// from the moment it is set; {} ends every fault.
//
// # --headers
//
// --headers announces the limits in force in every payment answer. ietf, the IETF httpapi draft's:
//
//	RateLimit-Policy: "w0";q=100;w=1, "w1";q=3000;w=60
//	RateLimit: "w0";r=42;t=1, "w1";r=2950;t=60
//
// (q the limit, w the window in whole seconds, r what remains, t the seconds until the oldest request in
// the window leaves it). x-ratelimit: X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset
// (seconds) for the shortest window. none (the default): nothing.
//
// # A rejected account
//
// POST /faults {"reject_for":"30s"} rejects the account for that long, as a provider rejects a
// misconfigured one: every payment request is answered at once, before the limits, with 422 (or
// "reject_status", any 4xx but 429) and {"error":"the account is not enabled for this operation",
// "code":"account_rejected"}. A rejected request is counted in requests and rejected_injected, never
// charged, and its idempotency key is not stored: the same key is charged once the rejections end
// ({} or the time is up).
//
// # POST /limits
//
// POST /limits changes the limits enforced from that moment, as a provider that lowers or raises an
// account's limits during the day (the live-limits test uses it):
//
//	{"limits":"50/1s,1000/1m"}
//
// The new windows are checked over the requests it remembers (at least the longest window it has had);
// each window's max_in_window in /stats starts afresh. A bad spec is a 400 and changes nothing.
//
// # Auth
//
// --oauth2 id:secret serves POST /token, the client credentials grant for that one client (HTTP Basic,
// or client_id and client_secret in the form; another client gets 401 invalid_client), each token
// valid for --token-ttl (default 1h) on the simulator's clock; every payment request must then carry
// an unexpired one as a bearer token. --hmac-secret KEY requires every payment request signed as
// paygate's auth type hmac signs it: X-Signature, HMAC-SHA256 keyed with KEY over
// "<X-Timestamp>\n<METHOD>\n<request target as sent>\n<body>" (hex or base64), X-Timestamp within 5 minutes
// of its clock. A request refused for either is answered 401 naming what failed and counts only in
// unauthorized (not in requests: the account's limits never see it). /stats adds tokens_issued,
// tokens_refused, and paths: the payment requests that passed, by request target (path and query as
// sent). --tls-cert and --tls-key serve TLS; --client-ca then requires a client certificate its CAs
// signed.
//
// # In process
//
// Start("127.0.0.1:0", Options{...}) returns a [Server] with URL() and Stats().
package sim
