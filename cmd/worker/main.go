// Command worker is paygate's single binary: the worker itself and the operator tools around it.
//
//	worker demo         [--duration D] [--workers N] [--jobs N] [--json] [--verbose] [--redis ADDR] [--rabbitmq URL | --kafka BROKERS]
//	worker run          --config FILE
//	worker enqueue      --config FILE (--provider NAME --count N [--cost C] [--rate R] | --file jobs.jsonl)
//	worker check-config --config FILE
//	worker gate try     --config FILE --provider NAME [--id ID] [--cost N] [--max-wait D | --force]
//	worker gate status  --config FILE --provider NAME [--json]
//	worker gate serve   --config FILE [--listen ADDR]
//	worker dashboard    --config FILE [--listen ADDR]
//	worker results      --config FILE [--provider NAME] [--follow] [--json]
//	worker dead list    --config FILE --provider NAME [--reason R] [--since DUR] [--limit N] [--json]
//	worker dead replay  --config FILE --provider NAME [--reason R] [--id ID,...] [--max N] [--rate N/s] [--dry-run] [--json]
//	worker dead purge   --config FILE --provider NAME [--reason R] [--before T] --yes [--json]
//	worker limits set   --config FILE --provider NAME --limits SPEC [--replace] [--json]
//	worker limits show  --config FILE --provider NAME [--json]
//	worker limits reset --config FILE --provider NAME [--json]
//	worker provider-sim --listen ADDR --limits SPEC [--latency D] [--jitter D] [--error-rate F] [--timeout-rate F] [--max-in-flight N]
//
// Exit status: 0 success (a denied gate try is a success), 1 a runtime failure (Redis unreachable, say),
// 2 bad usage or an invalid configuration, 3 done in part (worker dead replay); the message goes to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/paygate/paygate/wire"
)

const usage = `usage: worker <command> [flags]

commands:
  demo           run everything in one process (embedded Redis and Kafka) and report what the providers saw
  run            consume jobs, ask the gate, dispatch to providers, settle (until SIGTERM; SIGHUP reloads)
  enqueue        publish synthetic jobs (--provider --count) or a JSON-lines file (--file) with confirms
  check-config   validate a configuration file and print its providers and limits
  gate try       ask the gate once for a provider's budget and print the verdict as JSON (--force: token_bucket)
  gate status    print each of a provider's policies: use, reservations, remaining, reset
  gate serve     serve the gate over HTTP/JSON, so that synchronous callers share the workers' budget
  dashboard      serve a live page of every provider's budget, read from Redis (--listen 127.0.0.1:8080)
  results        print the jobs' results as they arrive (--follow keeps on; --json prints each body)
  dead           list, replay or purge a provider's dead letters (replay: paced, copies confirmed first)
  cancel         cancel a job (--provider --id): no worker sends it from the command's return (exit 3: it left)
  job show       what the gate knows of a job (--provider --id): admitted, sent, cancelled, leases
  limits         set, show or reset a provider's live limits (in force fleet-wide when it returns)
  provider-sim   serve a strict simulated payment provider (the referee of tests and demos)
  probe          ask a worker's /readyz (--url): exit 0 when ready, 1 naming what is not (a health check)

Run "worker <command> -h" for a command's flags.
`

const gateUsage = `usage: worker gate <subcommand> --config FILE --provider NAME [flags]

subcommands:
  try      ask the gate once for a provider's budget and print the verdict as JSON (--force: token_bucket)
  status   print each of a provider's policies: use, reservations, remaining, reset
  serve    serve the gate over HTTP/JSON (docs/gate-service.md) until SIGTERM

Run "worker gate <subcommand> -h" for its flags.
`

// usageError marks bad flags or arguments: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintln(stderr, "worker:", err)
		var ue usageError
		var ce wire.ConfigError
		if errors.As(err, &ue) || errors.As(err, &ce) {
			return 2
		}
		if es := (exitStatus{}); errors.As(err, &es) {
			return es.code
		}
		return 1
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("no command")}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "check-config":
		return checkConfig(rest, stdout, stderr)
	case "gate":
		if len(rest) == 0 {
			fmt.Fprint(stderr, gateUsage)
			return usageError{errors.New("gate: want a subcommand: try, status or serve")}
		}
		switch rest[0] {
		case "try":
			return gateTry(ctx, rest[1:], stdout, stderr)
		case "status":
			return gateStatus(ctx, rest[1:], stdout, stderr)
		case "serve":
			return gateServe(ctx, rest[1:], stdout, stderr)
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, gateUsage)
			return nil
		}
		fmt.Fprint(stderr, gateUsage)
		return usageError{fmt.Errorf("gate: unknown subcommand %q (want try, status or serve)", rest[0])}
	case "limits":
		return limitsCmd(ctx, rest, stdout, stderr)
	case "dashboard":
		return dashboardCmd(ctx, rest, stdout, stderr)
	case "results":
		return resultsCmd(ctx, rest, stdout, stderr)
	case "dead":
		return deadCmd(ctx, rest, stdout, stderr)
	case "cancel":
		return cancelCmd(ctx, rest, stdout, stderr)
	case "job":
		return jobCmd(ctx, rest, stdout, stderr)
	case "run":
		return runWorker(ctx, rest, stdout, stderr)
	case "enqueue":
		return enqueue(ctx, rest, stdout, stderr)
	case "provider-sim":
		return providerSim(ctx, rest, stdout, stderr)
	case "probe":
		return probeCmd(ctx, rest, stdout, stderr)
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError{fmt.Errorf("unknown command %q", cmd)}
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// newFlags is newFlagSet with the shared --config flag.
func newFlags(name string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := newFlagSet(name, stderr)
	cfg := fs.String("config", envOr("PAYGATE_CONFIG", "config.yaml"), "configuration file (env PAYGATE_CONFIG)")
	return fs, cfg
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
