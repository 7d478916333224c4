package subscriber_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/awsconfig"
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

// A job of 6 chunks, one malformed, run by one subscriber, then every chunk
// again (a redelivery) by another sharing its bucket and topic: exactly one
// event reaches the subscribed queue, partial, with the counts and where the
// results are. The two run one after the other: fauxqs's PutObject ignores
// If-None-Match, so two subscribers settling a job at the same instant
// could both win there (they cannot on S3); that race is covered by
// TestCompletionEventOnceAcrossSubscribersAndRedeliveries, on a bucket
// whose conditional write is atomic.
func TestE2ECompletionEventExactlyOnce(t *testing.T) {
	store := newStore(t)
	client := sqstest.Client(t)
	topic, eventsURL := eventsTopic(t, client)
	cfg := subscriber.Config{Payloads: store, Events: topic}
	a, b := newPipeline(t, 5, cfg, nil), newPipeline(t, 5, cfg, nil)

	const chunks = 6
	m := job.Manifest{V: job.Version, JobID: "evjob", Chunks: chunks, Items: chunks, CreatedAt: time.Now().UTC()}
	var works []job.Work
	for c := range chunks - 1 {
		m.ChunkItems = append(m.ChunkItems, 1)
		works = append(works, job.Work{V: job.Version, JobID: "evjob", Chunk: c, Items: []job.Item{{ID: "i", Text: "hello events"}}})
	}
	m.ChunkItems = append(m.ChunkItems, 1)
	mb, _ := json.Marshal(m)
	if _, err := store.Put(t.Context(), job.ManifestKey("evjob"), mb); err != nil {
		t.Fatal(err)
	}
	malformed := `{"v":1,"job_id":"evjob","chunk":5,"items":[]}`
	run := func(p *pipeline) {
		p.send(works)
		if _, err := p.client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: &p.urls.Work, MessageBody: &malformed}); err != nil {
			t.Fatal(err)
		}
		p.collect(chunks-1, time.Minute)
	}
	var events []string
	// receive polls the events queue until one event came and then quiet
	// long enough for a duplicate to show up, or a minute passed.
	receive := func() {
		deadline, quietUntil := time.Now().Add(time.Minute), time.Now().Add(5*time.Second)
		for time.Now().Before(deadline) && (len(events) == 0 || time.Now().Before(quietUntil)) {
			out, err := client.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &eventsURL,
				MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range out.Messages {
				events = append(events, aws.ToString(msg.Body))
				quietUntil = time.Now().Add(5 * time.Second)
			}
		}
	}
	run(a)
	receive()
	// Every chunk again, on the other subscriber: the job is settled, and
	// each check finds the done marker.
	run(b)
	receive()
	a.shutdown()
	b.shutdown()
	if len(events) != 1 {
		t.Fatalf("%d events %q; want exactly one", len(events), events)
	}
	var ev job.CompletionEvent
	if err := json.Unmarshal([]byte(events[0]), &ev); err != nil {
		t.Fatalf("event %q: %v", events[0], err)
	}
	want := job.CompletionEvent{V: job.Version, Event: job.EventJobSettled, JobID: "evjob", Status: job.EventPartial,
		Chunks: chunks, ChunksDone: chunks - 1, ChunksFailed: 1, Items: chunks, ItemsDone: chunks - 1,
		ResultsURI: "s3://" + store.Bucket() + "/results/evjob/", FailedURI: "s3://" + store.Bucket() + "/failed/evjob/", At: ev.At}
	if ev != want {
		t.Errorf("event %+v; want %+v", ev, want)
	}
	if os.Getenv("VRAMQ_EVENTS_E2E_LOG") != "" {
		t.Logf("event: %s", events[0])
	}
}
