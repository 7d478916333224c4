package latency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/vramq/vramq/internal/sqscodec"
	"github.com/vramq/vramq/internal/testenv/jobq"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/localstack"
)

// drive is the light load, paced as loadgen's direct mode paces it at a
// low rate: one message per SendMessageBatch, token-paced at perS, stamped
// just before its call; two collectors long-poll the results queue (ten
// at a time, one second), as loadgen's do, and a message's latency is from
// its stamp to the receive that brought its result back. Consumers answer
// with a body that carries the work's job_id and chunk: a result, or the
// work itself when echoed.
func drive(ctx context.Context, client *sqs.Client, urls localstack.URLs, works []job.Work, perS float64) ([]time.Duration, error) {
	var mu sync.Mutex
	sentAt := make(map[job.Key]time.Time, len(works))
	var lat []time.Duration
	got := make(chan struct{})
	left := len(works)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		lim := rate.NewLimiter(rate.Limit(perS), 1)
		for _, w := range works {
			if err := lim.Wait(gctx); err != nil {
				return err
			}
			mu.Lock()
			sentAt[w.Key()] = time.Now()
			mu.Unlock()
			if err := jobq.Send(gctx, client, urls.Work, []job.Work{w}); err != nil {
				return err
			}
		}
		return nil
	})
	for range 2 {
		g.Go(func() error {
			for {
				select {
				case <-got:
					return nil
				default:
				}
				out, err := client.ReceiveMessage(gctx, &sqs.ReceiveMessageInput{QueueUrl: &urls.Results, MaxNumberOfMessages: 10,
					WaitTimeSeconds: 1})
				if err != nil {
					return fmt.Errorf("receiving results: %w", err)
				}
				now := time.Now()
				var del []string
				mu.Lock()
				for _, m := range out.Messages {
					k, err := keyOf(aws.ToString(m.Body))
					if err != nil {
						mu.Unlock()
						return fmt.Errorf("result message %s: %w", aws.ToString(m.MessageId), err)
					}
					if sent, ok := sentAt[k]; ok {
						delete(sentAt, k) // a duplicate counts once
						lat = append(lat, now.Sub(sent))
						if left--; left == 0 {
							close(got)
						}
					}
					del = append(del, aws.ToString(m.ReceiptHandle))
				}
				mu.Unlock()
				if len(del) > 0 {
					if _, err := client.DeleteMessageBatch(gctx, &sqs.DeleteMessageBatchInput{QueueUrl: &urls.Results,
						Entries: sqscodec.DeleteEntries(del)}); err != nil {
						return fmt.Errorf("deleting results: %w", err)
					}
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		mu.Lock()
		defer mu.Unlock()
		return nil, fmt.Errorf("after %d of %d results: %w", len(lat), len(works), err)
	}
	return lat, nil
}
