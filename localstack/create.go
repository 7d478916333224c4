package localstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/vramq/vramq/internal/sqscodec"
)

// Options adjust the definitions for one Create. The zero value creates the
// queues exactly as queues.json describes them.
type Options struct {
	// Prefix goes in front of every queue name: one per test keeps tests apart,
	// one per developer keeps a shared account tidy. Letters, digits, '-', '_'.
	Prefix string
	// MaxReceiveCount replaces the redrive policy's count; 0 keeps the definition's.
	MaxReceiveCount int
	// VisibilityTimeout replaces the work queue's, in whole seconds; 0 keeps the
	// definition's.
	VisibilityTimeout time.Duration
}

// URLs are the queue URLs Create made, as the binaries take them
// (QUEUE_URL, RESULTS_QUEUE_URL, DLQ_URL).
type URLs struct {
	Work, Results, DLQ string
}

// Create makes the queues of Definitions on the endpoint client points at, with
// opts applied: the dead-letter queue first, then the work queue with a
// RedrivePolicy naming the dead-letter queue's ARN, then the results queue, and
// last the dead-letter queue's RedriveAllowPolicy, which needs the work queue's
// ARN.
//
// Queues that already exist with the same attributes are reused, so Create can
// run on every start. A queue that exists with other attributes is an error
// that lists the differences; Create changes no existing attribute except a
// RedriveAllowPolicy the dead-letter queue does not have yet. Every queue's
// attributes are read back and checked, because emulators differ in what they
// accept silently.
//
// On error, the URLs of the queues created or found so far are returned with
// it and the queues left in place; Delete them only if the prefix is yours
// alone, as a found queue may be someone else's.
func Create(ctx context.Context, client *sqs.Client, opts Options) (URLs, error) {
	defs, err := opts.apply(Definitions())
	if err != nil {
		return URLs{}, err
	}
	urls := map[string]string{}
	arns := map[string]string{}
	current := map[string]map[string]string{}
	result := func() URLs {
		return URLs{Work: urls[RoleWork], Results: urls[RoleResults], DLQ: urls[RoleDLQ]}
	}

	for _, role := range creationOrder {
		q, _ := defs.Role(role)
		want := maps.Clone(q.Attributes)
		if p := q.RedrivePolicy; p != nil {
			want["RedrivePolicy"] = redrivePolicyJSON(arns[p.DeadLetterQueue], p.MaxReceiveCount)
		}
		url, got, err := createQueue(ctx, client, q.Name, want)
		if url != "" {
			urls[role] = url
		}
		if err != nil {
			return result(), err
		}
		if diffs := differences(want, got); len(diffs) > 0 {
			return result(), fmt.Errorf("queue %s: attributes after CreateQueue differ from the definition: %s", q.Name, strings.Join(diffs, "; "))
		}
		if got["QueueArn"] == "" {
			return result(), fmt.Errorf("queue %s: GetQueueAttributes returned no QueueArn", q.Name)
		}
		arns[role] = got["QueueArn"]
		current[role] = got
	}

	for _, role := range creationOrder {
		q, _ := defs.Role(role)
		if q.RedriveAllowPolicy == nil {
			continue
		}
		want := map[string]string{"RedriveAllowPolicy": redriveAllowPolicyJSON(q.RedriveAllowPolicy, arns)}
		if _, set := current[role]["RedriveAllowPolicy"]; set {
			if diffs := differences(want, current[role]); len(diffs) > 0 {
				return result(), fmt.Errorf("queue %s already exists with another redrive allow policy: %s; delete it or use another prefix",
					q.Name, strings.Join(diffs, "; "))
			}
			continue
		}
		// Not read back: SQS takes up to a minute to show a changed attribute.
		url := urls[role]
		if _, err := client.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: &url, Attributes: want}); err != nil {
			return result(), fmt.Errorf("queue %s: setting RedriveAllowPolicy: %w", q.Name, err)
		}
	}
	return result(), nil
}

// Delete deletes the queues in urls; empty URLs and queues already gone are
// skipped. SQS lets a deleted queue's name be reused only after 60 seconds, so
// this suits per-test prefixes, not re-creating the same names.
func Delete(ctx context.Context, client *sqs.Client, urls URLs) error {
	var errs []error
	for _, url := range []string{urls.Work, urls.Results, urls.DLQ} {
		if url == "" {
			continue
		}
		_, err := client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: &url})
		if err != nil && !isQueueDoesNotExist(err) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", url, err))
		}
	}
	return errors.Join(errs...)
}

// apply returns defs with the prefix and overrides of o, or why they are invalid.
func (o Options) apply(defs Queues) (Queues, error) {
	var errs []error
	if o.MaxReceiveCount != 0 {
		if err := checkInt("max receive count", strconv.Itoa(o.MaxReceiveCount), maxReceiveCountRange); err != nil {
			errs = append(errs, err)
		}
	}
	var visibility string
	if o.VisibilityTimeout != 0 {
		if o.VisibilityTimeout%time.Second != 0 {
			errs = append(errs, fmt.Errorf("visibility timeout %v: SQS takes whole seconds", o.VisibilityTimeout))
		} else {
			visibility = strconv.Itoa(int(o.VisibilityTimeout / time.Second))
			if err := checkInt("visibility timeout (seconds)", visibility, attributeRanges["VisibilityTimeout"]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, q := range []*Queue{&defs.Work, &defs.Results, &defs.DLQ} {
		q.Name = o.Prefix + q.Name
		if err := validateName(q.Name); err != nil {
			errs = append(errs, fmt.Errorf("prefix %q: %w", o.Prefix, err))
		}
		if q.RedrivePolicy != nil && o.MaxReceiveCount != 0 {
			q.RedrivePolicy.MaxReceiveCount = o.MaxReceiveCount
		}
	}
	if visibility != "" {
		defs.Work.Attributes["VisibilityTimeout"] = visibility
	}
	return defs, errors.Join(errs...)
}

// createQueue returns the queue's URL and its attributes as SQS reports them.
// SQS answers CreateQueue for an existing queue with its URL when the given
// attributes match, and with QueueNameExists when they do not; the error then
// spells out which differ, which SQS does not.
func createQueue(ctx context.Context, client *sqs.Client, name string, attrs map[string]string) (string, map[string]string, error) {
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &name, Attributes: attrs})
	if err != nil {
		if !isQueueNameExists(err) {
			return "", nil, fmt.Errorf("creating queue %s: %w", name, err)
		}
		existing, gerr := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if gerr != nil {
			return "", nil, fmt.Errorf("queue %s already exists with other attributes: %w", name, err)
		}
		got, gerr := queueAttributes(ctx, client, *existing.QueueUrl)
		if gerr != nil {
			return "", nil, fmt.Errorf("queue %s already exists with other attributes: %w", name, err)
		}
		diffs := differences(attrs, got)
		if len(diffs) == 0 {
			return "", nil, fmt.Errorf("queue %s already exists, and SQS refused it though its attributes read back equal: %w", name, err)
		}
		return "", nil, fmt.Errorf("queue %s already exists with other attributes: %s; delete it or use another prefix",
			name, strings.Join(diffs, "; "))
	}
	url := *out.QueueUrl
	got, err := queueAttributes(ctx, client, url)
	if err != nil {
		return url, nil, fmt.Errorf("queue %s: %w", name, err)
	}
	return url, got, nil
}

func queueAttributes(ctx context.Context, client *sqs.Client, url string) (map[string]string, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       &url,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		return nil, fmt.Errorf("reading attributes: %w", err)
	}
	return out.Attributes, nil
}

// differences lists each attribute of want that got lacks or holds another
// value for. The redrive policies are JSON, compared by meaning: SQS returns
// them re-encoded (maxReceiveCount as a number even when sent as a string).
func differences(want, got map[string]string) []string {
	var diffs []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w := want[name]
		g, ok := got[name]
		var equal bool
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s is not set, want %s", name, w))
			continue
		case name == "RedrivePolicy":
			equal = sameRedrivePolicy(w, g)
		case name == "RedriveAllowPolicy":
			equal = sameRedriveAllowPolicy(w, g)
		default:
			equal = w == g
		}
		if !equal {
			diffs = append(diffs, fmt.Sprintf("%s is %s, want %s", name, g, w))
		}
	}
	return diffs
}

type redrivePolicy struct {
	DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	// SQS documents the count as a string and returns it as a number; both parse.
	MaxReceiveCount json.Number `json:"maxReceiveCount"`
}

type redriveAllowPolicy struct {
	RedrivePermission string   `json:"redrivePermission"`
	SourceQueueArns   []string `json:"sourceQueueArns,omitempty"`
}

// The encodings below are also what the LocalStack init hook writes, byte for
// byte: emulators that compare attribute strings literally then see the same
// queue whichever of the two created it.

func redrivePolicyJSON(dlqARN string, maxReceiveCount int) string {
	b, _ := json.Marshal(redrivePolicy{DeadLetterTargetArn: dlqARN, MaxReceiveCount: json.Number(strconv.Itoa(maxReceiveCount))})
	return string(b)
}

func redriveAllowPolicyJSON(p *RedriveAllowPolicy, arns map[string]string) string {
	v := redriveAllowPolicy{RedrivePermission: p.RedrivePermission}
	for _, role := range p.SourceQueues {
		v.SourceQueueArns = append(v.SourceQueueArns, arns[role])
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func sameRedrivePolicy(a, b string) bool {
	var pa, pb redrivePolicy
	if json.Unmarshal([]byte(a), &pa) != nil || json.Unmarshal([]byte(b), &pb) != nil {
		return false
	}
	return pa.DeadLetterTargetArn == pb.DeadLetterTargetArn && sameNumber(pa.MaxReceiveCount, pb.MaxReceiveCount)
}

func sameNumber(a, b json.Number) bool {
	x, errA := a.Int64()
	y, errB := b.Int64()
	return errA == nil && errB == nil && x == y
}

func sameRedriveAllowPolicy(a, b string) bool {
	var pa, pb redriveAllowPolicy
	if json.Unmarshal([]byte(a), &pa) != nil || json.Unmarshal([]byte(b), &pb) != nil {
		return false
	}
	slices.Sort(pa.SourceQueueArns)
	slices.Sort(pb.SourceQueueArns)
	return pa.RedrivePermission == pb.RedrivePermission && slices.Equal(pa.SourceQueueArns, pb.SourceQueueArns)
}

// The SDK's typed error, or its code in either spelling: the JSON
// protocol's ("QueueDoesNotExist") or the query protocol's, which some
// emulators send ("AWS.SimpleQueueService.NonExistentQueue").
func isQueueNameExists(err error) bool {
	var typed *types.QueueNameExists
	return errors.As(err, &typed) || sqscodec.HasCode(err, "QueueNameExists", "QueueAlreadyExists")
}

func isQueueDoesNotExist(err error) bool {
	var typed *types.QueueDoesNotExist
	return errors.As(err, &typed) || sqscodec.HasCode(err, "QueueDoesNotExist", "NonExistentQueue")
}
