package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/wire"
)

// gateTry is "worker gate try": ask the gate once and print the verdict as JSON.
func gateTry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gate try", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	id := fs.String("id", "", "job id (default: a random id)")
	cost := fs.Int64("cost", 1, "units of budget the job costs")
	maxWait := fs.Duration("max-wait", 0, "accept a reserved slot up to this far ahead (0: now or denied)")
	force := fs.Bool("force", false, "admit now even from an empty bucket, draining it to zero (token_bucket only)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *id == "" {
		*id = randomID()
	}
	l, err := openGate("gate try", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	algo, err := l.Algorithm(*provider)
	if err != nil {
		return err
	}
	var v gate.Verdict
	switch {
	case *force && algo != gate.TokenBucket:
		return usageError{fmt.Errorf("gate try: --force needs algorithm %s; provider %s uses %s", gate.TokenBucket, *provider, algo)}
	case *force && *maxWait != 0:
		return usageError{errors.New("gate try: --force goes now; it takes no --max-wait")}
	case *force:
		v, err = l.Force(ctx, *provider, *id, *cost)
	default:
		v, err = l.Reserve(ctx, *provider, *id, *cost, *maxWait)
	}
	if err != nil {
		if errors.Is(err, gate.ErrInvalid) {
			return usageError{err} // a bad --cost or --id
		}
		return err
	}
	if v.Lease != "" { // a try sends nothing: under max_in_flight its lease goes back at once
		if err := l.Land(ctx, *provider, v.Lease); err != nil {
			return err
		}
	}
	return writeJSON(stdout, report.VerdictOf(*provider, *id, *cost, algo, v, *force))
}

// toolGate is an operator command's gate, with the configuration it was built from; Close closes its
// Redis client.
type toolGate struct {
	*gate.Limiter
	cfg   *config.Config
	Close func()
}

// openGate loads the config at path and connects the gate, for a command about one provider.
func openGate(cmd, path, provider string, stderr io.Writer) (*toolGate, error) {
	if provider == "" {
		return nil, usageError{fmt.Errorf("%s: --provider is required", cmd)}
	}
	c, err := loadConfig(path, stderr)
	if err != nil {
		return nil, err
	}
	if _, ok := c.Providers[provider]; !ok {
		return nil, usageError{fmt.Errorf("%s: provider %q is not configured in %s", cmd, provider, path)}
	}
	l, rdb, err := wire.CheckedGate(context.Background(), c, wire.Tool)
	if err != nil {
		return nil, err
	}
	return &toolGate{Limiter: l, cfg: c, Close: func() { rdb.Close() }}, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "try-" + hex.EncodeToString(b[:])
}
