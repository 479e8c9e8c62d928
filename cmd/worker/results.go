package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/wire"
)

// resultsIdle is how long `worker results` without --follow waits for the next result before it stops.
const resultsIdle = 2 * time.Second

// resultsCmd is "worker results": the results as they arrive, for an operator's terminal (docs/results.md).
func resultsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("results", stderr)
	provider := fs.String("provider", "", "only this provider's results")
	follow := fs.Bool("follow", false, "keep printing until interrupted (without it: stop after 2s without a result)")
	asJSON := fs.Bool("json", false, "print each result's JSON body, one a line, as the broker holds it")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	if *provider != "" {
		if _, ok := c.Providers[*provider]; !ok {
			return usageError{fmt.Errorf("results: provider %q is not configured in %s", *provider, *path)}
		}
	}
	if !c.Results.Enabled {
		fmt.Fprintln(stderr, "results: results.enabled is false in "+*path+": the workers publish no results")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	idle := time.AfterFunc(time.Hour, cancel) // armed once following, unless --follow
	idle.Stop()
	defer idle.Stop()
	bound := func(what string) {
		fmt.Fprintln(stderr, "results: following "+what)
		if !*follow {
			idle.Reset(resultsIdle)
		}
	}
	return wire.FollowResults(ctx, c, wire.Options{}, *provider, bound, func(body []byte) {
		mu.Lock()
		defer mu.Unlock()
		if !*follow {
			idle.Reset(resultsIdle)
		}
		printResult(stdout, body, *asJSON)
	})
}

// printResult writes one result: its body as is (--json), or a line of its main fields.
func printResult(w io.Writer, body []byte, asJSON bool) {
	if asJSON {
		fmt.Fprintf(w, "%s\n", body)
		return
	}
	var r consumers.Result
	if err := json.Unmarshal(body, &r); err != nil {
		fmt.Fprintf(w, "unreadable result: %q\n", truncateText(string(body), 120))
		return
	}
	line := []string{r.SettledAt, r.Provider, r.ID, r.Outcome}
	if r.Reason != "" {
		line = append(line, "reason="+r.Reason)
	}
	if r.Status != 0 {
		line = append(line, fmt.Sprintf("status=%d", r.Status))
	}
	if r.Response != nil && len(r.Response.Body) > 0 {
		line = append(line, "body="+truncateText(string(r.Response.Body), 120))
	}
	fmt.Fprintln(w, strings.Join(line, " "))
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
