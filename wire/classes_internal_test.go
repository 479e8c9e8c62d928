package wire

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/internal/testenv"
)

// The fleet's word that a provider's higher classes wait: none at first, then as long as it was given for,
// per provider.
func TestWaitingKeys(t *testing.T) {
	t.Run("redis", func(t *testing.T) { waitingKeysOn(t, testenv.RedisAddr()) })
	// miniredis expires nothing on its own clock (the demo's embedded Redis): the word lapses all the same.
	t.Run("miniredis", func(t *testing.T) { waitingKeysOn(t, miniredis.RunT(t).Addr()) })
}

func waitingKeysOn(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	k := waitingKeys{rdb: rdb, prefix: fmt.Sprintf("wire-waiting-%d", time.Now().UnixNano())}
	defer rdb.Del(ctx, WaitingKey(k.prefix, "acme"))
	if d, err := k.Waiting(ctx, "acme"); err != nil || d != 0 {
		t.Fatalf("before any word: %v %v, want 0", d, err)
	}
	if err := k.NoteWaiting(ctx, "acme", 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d, err := k.Waiting(ctx, "acme"); err != nil || d <= 400*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("after a word for 500ms: %v %v", d, err)
	}
	if d, err := k.Waiting(ctx, "globex"); err != nil || d != 0 {
		t.Fatalf("another provider: %v %v, want 0", d, err)
	}
	time.Sleep(550 * time.Millisecond)
	if d, err := k.Waiting(ctx, "acme"); err != nil || d != 0 {
		t.Fatalf("after it lapsed: %v %v, want 0", d, err)
	}
}
