package publishertest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/fakeoai"
	"github.com/vramq/vramq/job"
)

// MidRunFake is a fake model server for a batch stopped mid-run (cancelled,
// expired): a prompt with "slow" in it is 40 steps of 20 ms, so that a
// batch of a few hundred such lines runs well past the 5 s a subscriber's
// answer about a job's cancel lasts, and a stop reaches chunks not yet
// started; any other prompt is quick, its answer quickTokens long.
func MidRunFake(quickTokens int) *fakeoai.Server {
	return fakeoai.New(fakeoai.Config{TokenLatency: 20 * time.Millisecond, NoMetrics: true,
		OutputTokens: func(prompt string, _ int) int {
			if strings.Contains(prompt, "slow") {
				return 40
			}
			return quickTokens
		}})
}

// expiresAt is the window's end in a batch record.
var expiresAt = regexp.MustCompile(`"expires_at":[0-9]+`)

// ExpireBatch moves owner's batch id's window into the past, as 24 hours
// would: no clock of the publisher's can be moved from outside it. The
// record's version is the write's condition, since the publisher may be
// writing the record too; the publisher's next read or sweep expires it.
func ExpireBatch(ctx context.Context, store *payload.Store, owner, id string) error {
	key := job.BatchKey(owner, id)
	for range 10 {
		raw, etag, err := store.ReadVersion(ctx, key, 1<<20)
		if err != nil {
			return err
		}
		loc := expiresAt.FindIndex(raw)
		if loc == nil {
			return fmt.Errorf("no expires_at in the record of %s: %s", id, raw)
		}
		past := fmt.Appendf(nil, `"expires_at":%d`, time.Now().Unix()-1)
		raw = append(append(append([]byte(nil), raw[:loc[0]]...), past...), raw[loc[1]:]...)
		if _, err = store.PutIfMatch(ctx, key, raw, etag); err == nil {
			return nil
		}
	}
	return fmt.Errorf("the record of %s kept changing", id)
}
