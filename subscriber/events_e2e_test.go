package subscriber_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/awsconfig"
	"github.com/vramq/vramq/internal/payload"
	"github.com/vramq/vramq/internal/testenv/sqstest"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/snsevents"
)

// eventsTopic makes an SNS topic with an SQS queue subscribed to it (raw
// delivery: the queue's messages are the events' bodies), as docs/events.md
// shows a consumer of the events doing, and returns the topic's sink and the
// queue's URL.
func eventsTopic(t *testing.T, client *sqs.Client) (*snsevents.Topic, string) {
	t.Helper()
	cfg, err := awsconfig.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := sns.NewFromConfig(cfg)
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := "vramq-events-" + hex.EncodeToString(r[:])
	topic, err := sc.CreateTopic(t.Context(), &sns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	t.Cleanup(func() { _, _ = sc.DeleteTopic(t.Context(), &sns.DeleteTopicInput{TopicArn: topic.TopicArn}) })
	q, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = client.DeleteQueue(t.Context(), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl}) })
	attrs, err := client.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sc.Subscribe(t.Context(), &sns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint:   aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return snsevents.New(sc, aws.ToString(topic.TopicArn)), aws.ToString(q.QueueUrl)
}

// emulatorStore is a payload bucket on the fauxqs emulator, whose PutObject
// ignores If-None-Match: Create there reads first, as PutIfAbsent does, or
// every check that found a job settled would overwrite its done marker and
// publish. On S3 the write goes first (payload.Store.Create).
type emulatorStore struct{ *payload.Store }

func (s emulatorStore) Create(ctx context.Context, key string, body []byte) (bool, []byte, error) {
	return s.PutIfAbsent(ctx, key, body)
}

// A job of 6 chunks, one dead-lettered (its claim-check is missing), run by one subscriber, then
// every chunk again (a redelivery) by another sharing its bucket and topic:
// exactly one event reaches the subscribed queue, partial, with the counts
// and where the results are. Then a chunk 5 that runs: its result lands
// after the partial event, and a corrected one follows, revision 2,
// complete. The two run one after the other: fauxqs's PutObject ignores
// If-None-Match, so two subscribers settling a job at the same instant
// could both win there (they cannot on S3); that race is covered by
// TestCompletionEventOnceAcrossSubscribersAndRedeliveries, on a bucket
// whose conditional write is atomic.
func TestE2ECompletionEventExactlyOnce(t *testing.T) {
	t.Parallel() // mostly waiting on real time: queues, visibility, processes
	store := newStore(t)
	client := sqstest.Client(t)
	topic, eventsURL := eventsTopic(t, client)
	cfg := subscriber.Config{Payloads: emulatorStore{store}, Events: topic}
	a, b := newPipeline(t, 5, cfg, nil), newPipeline(t, 5, cfg, nil)

	const chunks = 6
	m := job.Manifest{V: job.Version, JobID: "evjob", Chunks: chunks, CreatedAt: time.Now().UTC()}
	var works []job.Work
	for c := range chunks - 1 {
		m.ChunkItems = append(m.ChunkItems, 1)
		works = append(works, job.Work{V: job.Version, JobID: "evjob", Chunk: c, Items: []job.Item{{ID: "i", Text: "hello events"}}})
	}
	// Chunk 5 decodes as work but its one item's claim-check names an object
	// that is not there: it is dead-lettered, claim_check, with a failed
	// marker. (A chunk over the budget no longer is: it runs in parts.)
	missing := job.Work{V: job.Version, JobID: "evjob", Chunk: chunks - 1, Items: []job.Item{{ID: "gone",
		Ref: &job.PayloadRef{Bucket: store.Bucket(), Key: job.ItemKey("evjob", "gone"), Size: 10, SHA256: strings.Repeat("0", 64)}}}}
	m.ChunkItems = append(m.ChunkItems, len(missing.Items))
	m.Items = chunks - 1 + len(missing.Items)
	mb, _ := json.Marshal(m)
	if _, err := store.Put(t.Context(), job.ManifestKey("evjob"), mb); err != nil {
		t.Fatal(err)
	}
	run := func(p *pipeline) {
		p.send(append(append([]job.Work(nil), works...), missing))
		p.collect(chunks-1, time.Minute)
	}
	var events []*sqstypes.Message
	// receive polls the events queue until want events came and then quiet
	// long enough for a duplicate to show up, or a minute passed.
	receive := func(want int) {
		deadline, quietUntil := time.Now().Add(time.Minute), time.Now().Add(5*time.Second)
		for time.Now().Before(deadline) && (len(events) < want || time.Now().Before(quietUntil)) {
			out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &eventsURL,
				MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range out.Messages {
				events = append(events, &msg)
				quietUntil = time.Now().Add(5 * time.Second)
			}
		}
	}
	run(a)
	receive(1)
	// Every chunk again, on the other subscriber: the job is settled, and
	// each check finds the done marker and the same count.
	run(b)
	receive(1)
	if len(events) != 1 {
		t.Fatalf("%d events; want exactly one", len(events))
	}
	// A chunk 5 that fits, as a redelivery of the real one would.
	fits := job.Work{V: job.Version, JobID: "evjob", Chunk: chunks - 1, Items: []job.Item{{ID: "gone", Text: "small"}}}
	a.send([]job.Work{fits})
	a.collect(1, time.Minute)
	receive(2)
	a.shutdown()
	b.shutdown()
	if len(events) != 2 {
		t.Fatalf("%d events; want the first and one correction", len(events))
	}
	var first, second job.CompletionEvent
	for i, ev := range []*job.CompletionEvent{&first, &second} {
		if err := json.Unmarshal([]byte(aws.ToString(events[i].Body)), ev); err != nil {
			t.Fatalf("event %q: %v", aws.ToString(events[i].Body), err)
		}
	}
	want := job.CompletionEvent{V: job.Version, Event: job.EventJobSettled, JobID: "evjob", Revision: 1, Status: job.EventPartial,
		Chunks: chunks, ChunksDone: chunks - 1, ChunksFailed: 1, Items: m.Items, ItemsDone: chunks - 1,
		ResultsURI: "s3://" + store.Bucket() + "/results/evjob/", FailedURI: "s3://" + store.Bucket() + "/failed/evjob/", At: first.At}
	if first != want {
		t.Errorf("event %+v; want %+v", first, want)
	}
	want.Revision, want.Status, want.ChunksDone, want.ChunksFailed, want.ItemsDone, want.At = 2, job.EventComplete, chunks, 0, m.Items, second.At
	if second != want {
		t.Errorf("corrected event %+v; want %+v", second, want)
	}
	if a := events[1].MessageAttributes[snsevents.AttrRevision]; aws.ToString(a.DataType) != "Number" || aws.ToString(a.StringValue) != "2" {
		t.Errorf("the correction's %s attribute: %s %q; want Number 2", snsevents.AttrRevision, aws.ToString(a.DataType), aws.ToString(a.StringValue))
	}
	if os.Getenv("VRAMQ_EVENTS_E2E_LOG") != "" {
		t.Logf("events: %s\n%s", aws.ToString(events[0].Body), aws.ToString(events[1].Body))
	}
}
