package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/paygate/paygate/demo"
)

// runDemo is "worker demo": the whole system in one process, with embedded Redis and Kafka unless real
// servers are given. Exit status 1 when the ledger finds a job lost, a referee saw a violation or was sent
// nothing, or --jobs were left unsettled.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	duration := fs.Duration("duration", 20*time.Second, "how long to keep the backlog up; then in-flight jobs finish (with --jobs alone: until they are done)")
	workers := fs.Int("workers", 3, "worker processes to simulate, each with its own clients")
	jobs := fs.Int("jobs", 0, "enqueue this many jobs up front instead of keeping a backlog for the duration")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object")
	verbose := fs.Bool("verbose", false, "show the workers' warnings (at shutdown Kafka reports records it will read again)")
	redisAddr := fs.String("redis", "", "use this Redis (host:port) instead of the embedded one")
	amqpURL := fs.String("rabbitmq", "", "use RabbitMQ at this amqp:// URL instead of the embedded Kafka")
	kafkaBrokers := fs.String("kafka", "", "use these Kafka brokers (comma-separated) instead of the embedded Kafka")
	if err := parse(fs, args); err != nil {
		return err
	}
	o := demo.Options{Duration: *duration, Workers: *workers, Jobs: *jobs, Redis: *redisAddr, RabbitMQ: *amqpURL}
	if *jobs > 0 && !isSet(fs, "duration") {
		o.Duration = 0
	}
	if *kafkaBrokers != "" {
		o.Kafka = strings.Split(*kafkaBrokers, ",")
	}
	// Progress goes where the summary does not: stdout for the table, stderr when stdout carries JSON.
	o.Progress = stdout
	if *asJSON {
		o.Progress = stderr
	}
	o.Terminal = isTerminal(o.Progress)
	level := zap.ErrorLevel
	if *verbose {
		level = zap.WarnLevel
	}
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = ""
	o.Log = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(stderr), level))
	if o.Workers < 1 || o.Jobs < 0 || o.Duration < 0 {
		return usageError{errors.New("demo: --workers must be >= 1, --jobs and --duration >= 0")}
	}
	if o.RabbitMQ != "" && o.Kafka != nil {
		return usageError{errors.New("demo: give --rabbitmq or --kafka, not both")}
	}
	s, err := demo.Run(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		e := json.NewEncoder(stdout)
		if err := e.Encode(s); err != nil {
			return err
		}
	} else if err := s.WriteTable(stdout); err != nil {
		return err
	}
	var bad []string
	if s.Lost > 0 {
		bad = append(bad, fmt.Sprintf("%d jobs lost", s.Lost))
	}
	if o.Jobs > 0 && s.Pending > 0 {
		bad = append(bad, fmt.Sprintf("%d of the %d jobs were not settled in time", s.Pending, o.Jobs))
	}
	for _, p := range s.Providers {
		if p.Violations > 0 {
			bad = append(bad, fmt.Sprintf("%s saw %d violations", p.Name, p.Violations))
		}
		if p.Dispatched == 0 {
			bad = append(bad, fmt.Sprintf("%s was sent nothing", p.Name))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("demo: %s", strings.Join(bad, "; "))
	}
	return nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// isTerminal reports whether w is a terminal (not merely a character device: /dev/null is one too).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
