package main

import (
	"context"
	"os"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/wire"
)

// FaultKillAfterResult names a fault the tests inject into a real worker process: set to a job id, the
// worker kills itself (SIGKILL, nothing settled) right after that job's result is confirmed, before its
// delivery is acknowledged: the crash between the two that docs/results.md promises costs a second
// result, never none. Unset in production.
const FaultKillAfterResult = "PAYGATE_FAULT_KILL_AFTER_RESULT"

// killAfterResult arms FaultKillAfterResult on parts' results, when it is set.
func killAfterResult(parts *wire.Parts) {
	id := os.Getenv(FaultKillAfterResult)
	if id == "" || parts.Core.Results == nil {
		return
	}
	parts.Core.Results = killingSink{parts.Core.Results, id}
}

type killingSink struct {
	consumers.ResultSink
	id string
}

func (k killingSink) PublishResult(ctx context.Context, provider, outcome, id string, body []byte) error {
	err := k.ResultSink.PublishResult(ctx, provider, outcome, id, body)
	if err == nil && id == k.id {
		if self, err := os.FindProcess(os.Getpid()); err == nil {
			_ = self.Kill() // SIGKILL
		}
		select {} // the signal ends the process
	}
	return err
}
