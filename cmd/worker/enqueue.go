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

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/wire"
)

// enqueue is "worker enqueue": publish synthetic jobs, or the jobs of a JSON-lines file, with confirms.
func enqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("enqueue", stderr)
	provider := fs.String("provider", "", "provider of the synthetic jobs")
	count := fs.Int("count", 0, "number of synthetic jobs")
	cost := fs.Int64("cost", 1, "cost of each synthetic job")
	rate := fs.Float64("rate", 0, "jobs per second (0: as fast as confirms allow)")
	prefix := fs.String("id-prefix", "", "synthetic job ids are <prefix>-<n> (default: a random prefix)")
	merchants := fs.String("merchant", "", "merchant of the synthetic jobs; a comma list takes turns (default: m_0 ... m_49 in turn)")
	file := fs.String("file", "", "JSON-lines file of jobs to publish instead ('-': stdin)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*file == "") == (*provider == "" || *count <= 0) {
		return usageError{errors.New("enqueue: give either --provider NAME --count N, or --file jobs.jsonl")}
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	maxCost := wire.MaxCosts(c)
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError(err)
	}
	type item struct {
		line int
		j    *job.Job
		body []byte
	}
	var items []item
	refused := 0
	if *file != "" {
		in := io.Reader(os.Stdin)
		if *file != "-" {
			f, err := os.Open(*file)
			if err != nil {
				return usageError{fmt.Errorf("enqueue: %w", err)}
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
			j, err := job.Decode([]byte(line), maxCost)
			if err != nil {
				fmt.Fprintf(stderr, "enqueue: %s line %d: %v\n", *file, n, err)
				refused++
				continue
			}
			items = append(items, item{n, j, []byte(line)})
		}
		if err := sc.Err(); err != nil {
			return usageError{fmt.Errorf("enqueue: %s: %w", *file, err)}
		}
	} else {
		if _, ok := maxCost[*provider]; !ok {
			return usageError{fmt.Errorf("enqueue: provider %q is not configured in %s", *provider, *path)}
		}
		if *prefix == "" {
			*prefix = "job-" + randomID()[4:14]
		}
		var names []string
		if *merchants != "" {
			for m := range strings.SplitSeq(*merchants, ",") {
				if m = strings.TrimSpace(m); m == "" {
					return usageError{fmt.Errorf("enqueue: --merchant %q: an empty merchant in the list", *merchants)}
				}
				names = append(names, m)
			}
		}
		for i := range *count {
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
			}{fmt.Sprintf("%s-%d", *prefix, i), *provider, 100 + i%9900, "EUR", merchant, *cost})
			j, err := job.Decode(body, maxCost)
			if err != nil {
				return usageError{fmt.Errorf("enqueue: %w", err)}
			}
			items = append(items, item{i + 1, j, body})
		}
	}
	b, err := wire.OpenBroker(ctx, c, wire.Options{Log: log})
	if err != nil {
		return err
	}
	defer b.Close()
	var tick <-chan time.Time
	if *rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / *rate))
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
		if err := b.Publish(ctx, it.j.Provider, it.body); err != nil {
			return fmt.Errorf("enqueue: job %s (line %d): %w; %d of %d published", it.j.ID, it.line, err, i, len(items))
		}
	}
	fmt.Fprintf(stdout, "published %d jobs\n", len(items))
	if refused > 0 {
		return usageError{fmt.Errorf("enqueue: refused %d invalid lines", refused)}
	}
	return nil
}
