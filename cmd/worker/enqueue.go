package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/wire"
)

// enqueue is "worker enqueue": publish synthetic jobs, or the jobs of a JSON-lines file, with confirms.
func enqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("enqueue", stderr)
	var s synthetic
	fs.StringVar(&s.provider, "provider", "", "provider of the synthetic jobs")
	fs.IntVar(&s.count, "count", 0, "number of synthetic jobs")
	fs.Int64Var(&s.cost, "cost", 1, "cost of each synthetic job")
	rate := fs.Float64("rate", 0, "jobs per second (0: as fast as confirms allow)")
	fs.StringVar(&s.prefix, "id-prefix", "", "synthetic job ids are <prefix>-<n> (default: a random prefix)")
	fs.StringVar(&s.merchants, "merchant", "", "merchant of the synthetic jobs; a comma list takes turns (default: m_0 ... m_49 in turn)")
	fs.StringVar(&s.priority, "priority", "", "priority of the synthetic jobs: high, normal or low (default: none, which is normal); each goes to its class's queue or topic")
	file := fs.String("file", "", "JSON-lines file of jobs to publish instead ('-': stdin)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*file == "") == (s.provider == "" || s.count <= 0) {
		return usageError{errors.New("enqueue: give either --provider NAME --count N, or --file jobs.jsonl")}
	}
	if s.priority != "" && (*file != "" || !job.ValidPriority(job.Priority(s.priority))) {
		return usageError{fmt.Errorf("enqueue: --priority %q: want high, normal or low, for synthetic jobs (a file's jobs give their own)", s.priority)}
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	maxCost, endpoints := wire.MaxCosts(c), c.JobEndpoints()
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError(err)
	}
	var items []enqueued
	refused := 0
	if *file != "" {
		items, refused, err = readJobs(*file, maxCost, endpoints, stderr)
	} else {
		items, err = s.jobs(*path, maxCost, endpoints)
	}
	if err != nil {
		return err
	}
	b, err := wire.OpenBroker(ctx, c, wire.Options{Log: log})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := publish(ctx, b, *rate, items); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published %d jobs\n", len(items))
	if refused > 0 {
		return usageError{fmt.Errorf("enqueue: refused %d invalid lines", refused)}
	}
	return nil
}

// enqueued is one job to publish: its line in the file (or its number among the synthetic jobs), the job
// and its body as published.
type enqueued struct {
	line int
	j    *job.Job
	body []byte
}

// readJobs reads the jobs of a JSON-lines file ('-': stdin). A line that is not a valid job is reported to
// stderr and counted in refused; blank lines are skipped.
func readJobs(file string, maxCost map[string]int64, endpoints job.Endpoints, stderr io.Writer) (items []enqueued, refused int, err error) {
	in := io.Reader(os.Stdin)
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, 0, usageError{fmt.Errorf("enqueue: %w", err)}
		}
		defer f.Close()
		in = f
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), job.MaxBody+1)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		j, err := job.DecodeFor([]byte(line), maxCost, endpoints)
		if err != nil {
			fmt.Fprintf(stderr, "enqueue: %s line %d: %v\n", file, n, err)
			refused++
			continue
		}
		items = append(items, enqueued{n, j, []byte(line)})
	}
	if err := sc.Err(); err != nil {
		return nil, 0, usageError{fmt.Errorf("enqueue: %s: %w", file, err)}
	}
	return items, refused, nil
}

// synthetic is what --provider, --count, --cost, --id-prefix and --merchant ask for.
type synthetic struct {
	provider  string
	count     int
	cost      int64
	prefix    string // empty: a random one
	merchants string // a comma list; empty: m_0 ... m_49
	priority  string // "": none (normal)
}

// jobs makes the synthetic jobs, each checked as a worker will decode it. path is the configuration file,
// for the message when the provider is not in it.
func (s synthetic) jobs(path string, maxCost map[string]int64, endpoints job.Endpoints) ([]enqueued, error) {
	if _, ok := maxCost[s.provider]; !ok {
		return nil, usageError{fmt.Errorf("enqueue: provider %q is not configured in %s", s.provider, path)}
	}
	prefix := s.prefix
	if prefix == "" {
		prefix = "job-" + randomID()[4:14]
	}
	names, err := s.merchantNames()
	if err != nil {
		return nil, err
	}
	var items []enqueued
	for i := range s.count {
		merchant := fmt.Sprintf("m_%d", i%50)
		if names != nil {
			merchant = names[i%len(names)]
		}
		body, _ := json.Marshal(struct {
			ID       string `json:"id"`
			Provider string `json:"provider"`
			Amount   int    `json:"amount"`
			Currency string `json:"currency"`
			Merchant string `json:"merchant"`
			Cost     int64  `json:"cost"`
			Priority string `json:"priority,omitempty"`
		}{fmt.Sprintf("%s-%d", prefix, i), s.provider, 100 + i%9900, "EUR", merchant, s.cost, s.priority})
		j, err := job.DecodeFor(body, maxCost, endpoints)
		if err != nil {
			return nil, usageError{fmt.Errorf("enqueue: %w", err)}
		}
		items = append(items, enqueued{i + 1, j, body})
	}
	return items, nil
}

// merchantNames is the --merchant list (nil when not given).
func (s synthetic) merchantNames() ([]string, error) {
	if s.merchants == "" {
		return nil, nil
	}
	var names []string
	for m := range strings.SplitSeq(s.merchants, ",") {
		if m = strings.TrimSpace(m); m == "" {
			return nil, usageError{fmt.Errorf("enqueue: --merchant %q: an empty merchant in the list", s.merchants)}
		}
		names = append(names, m)
	}
	return names, nil
}

// publish publishes the jobs in order, each to its provider's queue or topic for its class
// (consumers.Route), each confirmed, at most rate a second (0: as fast as confirms allow).
func publish(ctx context.Context, b wire.Broker, rate float64, items []enqueued) error {
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		tick = t.C
	}
	for i, it := range items {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				return fmt.Errorf("enqueue: interrupted after %d of %d jobs", i, len(items))
			}
		}
		if err := b.Publish(ctx, consumers.Route(it.j.Provider, it.j.Class()), it.body); err != nil {
			return fmt.Errorf("enqueue: job %s (line %d): %w; %d of %d published", it.j.ID, it.line, err, i, len(items))
		}
	}
	return nil
}
