package gate

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/paygate/paygate/job"
)

// provider is one provider's budget as the gate counts it: built from its Provider (newProvider) under the
// limits in force, and never changed after (live limits build another).
type provider struct {
	algo     Algorithm
	script   *family // lua/family with the algorithm's part
	policies []Policy
	keys     *keySet
	shape    int64 // the layout of the state (stateShape), which the epoch records
	// policyText is the settings' tail (lua/family's S[11..]): " limit window" (µs) per policy; settings
	// keeps the settings without a merchant's limits under the margin last asked for (provider.settingsAt)
	policyText string
	settings   *atomic.Pointer[settingsAt]
	// tag is the provider's key prefix (<prefix>:{<name>}:); keyMargin the margin its keys are named by
	tag       string
	keyMargin time.Duration
	// perMerchant are every merchant's limits (nil: none), named a merchant's own (Provider.Merchants)
	perMerchant *merchantLimits
	named       map[string]*merchantLimits
	// track records the merchants seen in the registry (Provider.TrackMerchants, or merchants' limits)
	track bool
	// version is the version of the live limits the policies follow (0: the configured ones, never
	// overridden); source says which: "config" or "override". configMin is the configured smallest limit.
	version   int64
	source    string
	configMin int64
	liveAt    int64 // µs: when the live limits were last set or reset (0: never, or not read)
	// maxFlight is Provider.MaxInFlight (0: no cap); lease its Lease in µs
	maxFlight, lease int64
	warmup           int64 // µs; 0: off
	// batch gathers the reserves asked while one is on its way (Options.Batch; nil: each alone)
	batch    *batcher
	minLimit int64
	dedup    int64 // µs: an admitted id is remembered, and the log kept, this long after its slot
	buckets  int   // SlidingWindow's sub-windows per window; 0 for the others
	// logCap is the most members SlidingLog's log keeps, the newest (0: no cap): set under live limits
	// without the configured longest window (build)
	logCap int64
	// burst is Provider.Burst (0: not paced); paced is the policy the pace follows
	burst int64
	paced Policy
	// floor and ceiling bound the margin in force (µs); inForce is the margin this process last learned
	floor, ceiling int64
	inForce        *atomic.Int64
}

// newProvider builds a provider under spec at a version of its live limits (0 for the configured ones):
// checked, its merchants' limits, the values derived from its settings, and its keys.
func newProvider(opts Options, name string, spec Provider, dedup time.Duration, version int64) (provider, error) {
	p, err := checkedProvider(name, spec, opts.Margin)
	if err != nil {
		return provider{}, err
	}
	if err := p.buildMerchants(name, spec, opts.Margin); err != nil {
		return provider{}, err
	}
	if err := checkBurst(name, spec.Policies, spec.Burst); err != nil {
		return provider{}, err
	}
	if spec.MaxInFlight < 0 || (spec.MaxInFlight > 0 && (spec.Lease <= 0 || spec.Lease > MaxHorizon)) {
		return provider{}, fmt.Errorf("gate: provider %s: max in flight must be >= 0, and with a cap the lease 1µs..%s; got %d and %s",
			name, MaxHorizon, spec.MaxInFlight, spec.Lease)
	}
	if err := spec.Breaker.check(name); err != nil {
		return provider{}, err
	}
	p.derive(opts, spec, dedup)
	p.nameKeys(opts.Prefix+":{"+name+"}:", opts.Margin, version)
	return p, nil
}

// checkedProvider is the provider's algorithm, script, policies and buckets, once its name, policies,
// algorithm and buckets are checked.
func checkedProvider(name string, spec Provider, margin time.Duration) (provider, error) {
	if !job.ValidProvider(name) {
		return provider{}, fmt.Errorf("gate: provider name %q must match ^%s$", name, job.ProviderPattern)
	}
	policies := spec.Policies
	if len(policies) == 0 {
		return provider{}, fmt.Errorf("gate: provider %s has no policies", name)
	}
	algo := spec.Algorithm
	if algo == "" {
		algo = SlidingLog
	}
	p := provider{algo: algo, script: families[algo], policies: append([]Policy(nil), policies...), source: SourceConfig}
	if p.script == nil {
		return provider{}, fmt.Errorf("gate: provider %s: unknown algorithm %q", name, algo)
	}
	p.buckets = spec.Buckets
	switch {
	case algo == SlidingWindow && p.buckets == 0:
		p.buckets = DefaultBuckets
	case algo == SlidingWindow && (p.buckets < 1 || p.buckets > MaxBuckets):
		return provider{}, fmt.Errorf("gate: provider %s: buckets must be 1..%d, got %d", name, MaxBuckets, p.buckets)
	case algo != SlidingWindow && p.buckets != 0:
		return provider{}, fmt.Errorf("gate: provider %s: buckets is only for %s, not %s", name, SlidingWindow, algo)
	}
	if err := checkPolicies("provider "+name, algo, policies, margin); err != nil {
		return provider{}, err
	}
	return p, nil
}

// derive sets what follows from the checked spec and options: the smallest limit, the pace, the
// in-flight cap, the bounds of the margin in force, how long ids are remembered, the warm-up and the
// batcher.
func (p *provider) derive(opts Options, spec Provider, dedup time.Duration) {
	p.minLimit = p.policies[0].Limit
	for _, pol := range p.policies {
		p.minLimit = min(p.minLimit, pol.Limit)
	}
	p.configMin = p.minLimit
	p.maxFlight, p.lease = spec.MaxInFlight, micros(spec.Lease)
	p.burst, p.paced = spec.Burst, ShortestPolicy(p.policies)
	if p.burst >= p.paced.Limit {
		p.burst = 0 // a burst of the whole limit turns pacing off: no pace is kept (two Redis calls fewer)
	}
	p.policyText = settingsText(p.policies)
	p.floor, p.ceiling = micros(opts.Margin), micros(max(opts.Margin, opts.MarginMax))
	if p.algo == SlidingWindow || p.algo == FixedWindow {
		p.ceiling = p.floor // buckets cut by the margin; windows checked against it
	}
	p.dedup = dedupMicros(p.algo, dedup, p.longestWindow(), p.ceiling)
	p.warmup = warmUpMicros(opts, p.policies, p.maxFlight, p.lease)
	p.inForce = &atomic.Int64{}
	p.inForce.Store(p.floor)
	p.settings = &atomic.Pointer[settingsAt]{}
	if opts.Batch > 1 {
		calls := opts.BatchCalls
		if calls == 0 {
			calls = DefaultBatchCalls
		}
		p.batch = &batcher{max: opts.Batch, calls: calls, linger: opts.BatchLinger, after: time.After, full: make(chan struct{}, 1)}
	}
}

// nameKeys names the provider's keys under tag (<prefix>:{<name>}:) and margin, at a version of its live
// limits, and the shape of its state.
func (p *provider) nameKeys(tag string, margin time.Duration, version int64) {
	p.tag, p.keyMargin, p.version = tag, margin, version
	p.keys = newKeySet(tag, p.algo, p.policies, margin, p.buckets, version)
	// The merchants' windows name their counters too; the pace is not part of the counted state.
	windows := append(p.policies[:len(p.policies):len(p.policies)], p.merchantWindows()...)
	p.shape = stateShape(tag, p.algo, windows, p.keys.counted())
}

// longestWindow is the longest window of the provider's policies and its merchants'.
func (p provider) longestWindow() time.Duration {
	longest := longestWindow(p.policies)
	for _, ml := range p.merchantLimits() {
		longest = max(longest, longestWindow(ml.policies))
	}
	return longest
}

// dedupMicros is how long after its slot an admitted id is remembered (µs): dedup, at most the longest
// window plus the widest margin (ceiling, µs), by which the state is kept and trimmed whatever margin a
// decision uses. SlidingLog's log is its id record, and must hold the longest window.
func dedupMicros(algo Algorithm, dedup, longest time.Duration, ceiling int64) int64 {
	if algo == SlidingLog {
		return micros(longest) + ceiling
	}
	return min(micros(dedup), micros(longest)+ceiling)
}

// warmUpMicros is how long a provider is paused after a loss of state (Options.WarmUp; 0: off): its
// shortest window (at most WarmUpCap), plus the widest margin, plus the Horizon; and, with an in-flight cap,
// at least a lease, since a lost state lost its leases too and the requests they stood for may be in
// flight for a lease yet.
func warmUpMicros(opts Options, policies []Policy, maxFlight, lease int64) int64 {
	if !opts.WarmUp {
		return 0
	}
	shortest := policies[0].Window
	for _, pol := range policies {
		shortest = min(shortest, pol.Window)
	}
	if opts.WarmUpCap > 0 {
		shortest = min(shortest, opts.WarmUpCap)
	}
	warmup := micros(shortest + max(opts.Margin, opts.MarginMax) + min(opts.Horizon, MaxHorizon))
	if maxFlight > 0 {
		warmup = max(warmup, lease)
	}
	return warmup
}

// stateShape names the layout a provider's state is kept in: its keys, and for the buckets the windows
// their fields are named by. The epoch records it (lua/family's S[10]), so that a change of algorithm,
// windows, buckets or margin, which starts the state afresh under new names while the provider still
// counts what it was sent, warms up like a loss of state. A sliding log keeps one layout whatever its
// limits.
func stateShape(tag string, algo Algorithm, policies []Policy, keys []string) int64 {
	h := fnv.New32a()
	fmt.Fprint(h, algo)
	for _, k := range keys {
		fmt.Fprint(h, "|", strings.TrimPrefix(k, tag))
	}
	if algo != SlidingLog {
		for _, pol := range policies {
			fmt.Fprint(h, "|", micros(pol.Window))
		}
	}
	return int64(h.Sum32())
}

// MaxMerchantLen is the longest merchant name the gate takes, in bytes (the job contract's 128 characters
// of UTF-8 fit).
const MaxMerchantLen = 512

// merchantLimits are a merchant's policies (Provider.PerMerchant, or its own in Provider.Merchants).
type merchantLimits struct {
	policies []Policy
	text     string // " limit window" (µs) per policy, as in the settings (provider.policyText)
	minLimit int64
}

// noLimits are the limits of a merchant without any of its own.
var noLimits = merchantLimits{minLimit: math.MaxInt64}

// merchantCall is the merchant part of a call: the job's merchant's name, limits (maybe none) and own
// state's keys.
type merchantCall struct {
	name   string
	limits *merchantLimits
	keys   []string
}

// merchantOf is the merchant part of a call for a job of the named merchant: nil when name is "", or the
// provider neither counts nor tracks merchants.
func (p provider) merchantOf(name string) *merchantCall {
	if name == "" {
		return nil
	}
	ml := p.named[name]
	if ml == nil {
		ml = p.perMerchant
	}
	switch {
	case ml != nil:
		return &merchantCall{name: name, limits: ml, keys: merchantKeys(p.tag, name, p.algo, ml.policies, p.keyMargin, p.buckets)}
	case p.track:
		return &merchantCall{name: name, limits: &noLimits} // recorded in the registry, counted by none of its own
	}
	return nil
}

// buildMerchants checks and keeps the merchants' limits (Provider.PerMerchant, Provider.Merchants).
func (p *provider) buildMerchants(name string, spec Provider, margin time.Duration) error {
	build := func(who string, policies []Policy) (*merchantLimits, error) {
		if !slices.Contains(MerchantAlgorithms, p.algo) {
			return nil, fmt.Errorf("gate: provider %s: %s does not count merchants' limits (%v do)", name, p.algo, MerchantAlgorithms)
		}
		if err := checkPolicies(who, p.algo, policies, margin); err != nil {
			return nil, err
		}
		ml := &merchantLimits{policies: append([]Policy(nil), policies...), minLimit: policies[0].Limit}
		ml.text = settingsText(policies)
		for _, pol := range policies {
			ml.minLimit = min(ml.minLimit, pol.Limit)
		}
		return ml, nil
	}
	p.track = spec.TrackMerchants || len(spec.PerMerchant) > 0 || len(spec.Merchants) > 0
	var err error
	if len(spec.PerMerchant) > 0 {
		if p.perMerchant, err = build("provider "+name+" per merchant", spec.PerMerchant); err != nil {
			return err
		}
	}
	for m, ms := range spec.Merchants {
		if m == "" || len(m) > MaxMerchantLen {
			return fmt.Errorf("gate: provider %s: merchant names must be 1..%d bytes, got %q", name, MaxMerchantLen, m)
		}
		if len(ms.Policies) == 0 {
			continue
		}
		if p.named == nil {
			p.named = map[string]*merchantLimits{}
		}
		if p.named[m], err = build("provider "+name+" merchant "+m, ms.Policies); err != nil {
			return err
		}
	}
	return nil
}

// merchantWindows lists the distinct windows of the merchants' limits, shortest first: the counters name a
// merchant's state by its windows, so a window that comes or goes is a change of the state's shape
// (stateShape), which warms up.
func (p provider) merchantWindows() []Policy {
	seen := map[time.Duration]bool{}
	for _, ml := range p.merchantLimits() {
		for _, pol := range ml.policies {
			seen[pol.Window] = true
		}
	}
	var out []Policy
	for _, w := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, Policy{Window: w})
	}
	return out
}

// merchantLimits lists every set of merchants' limits the provider has.
func (p provider) merchantLimits() []*merchantLimits {
	var out []*merchantLimits
	if p.perMerchant != nil {
		out = append(out, p.perMerchant)
	}
	for _, ml := range p.named {
		out = append(out, ml)
	}
	return out
}
