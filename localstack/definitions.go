package localstack

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/vramq/vramq/job"
)

// The roles of the queues in queues.json; also the keys of its "queues" object.
const (
	RoleWork    = "work"
	RoleResults = "results"
	RoleDLQ     = "dlq"
)

// creationOrder puts redrive targets first: a RedrivePolicy needs its target's ARN.
// parse rejects definitions this order cannot satisfy.
var creationOrder = []string{RoleDLQ, RoleWork, RoleResults}

//go:embed queues.json
var queuesJSON []byte

// Queues are the queues vramq needs, by role.
type Queues struct {
	Work, Results, DLQ Queue
}

// Queue is one queue's definition. Names are without any prefix.
type Queue struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Attributes are SQS attribute names and values exactly as CreateQueue takes
	// them, without the redrive policies, which name other queues by role.
	Attributes         map[string]string   `json:"attributes"`
	RedrivePolicy      *RedrivePolicy      `json:"redrivePolicy,omitempty"`
	RedriveAllowPolicy *RedriveAllowPolicy `json:"redriveAllowPolicy,omitempty"`
}

// RedrivePolicy sends a message to DeadLetterQueue (a role) once it has been
// received MaxReceiveCount times without being deleted.
type RedrivePolicy struct {
	DeadLetterQueue string `json:"deadLetterQueue"`
	MaxReceiveCount int    `json:"maxReceiveCount"`
}

// RedriveAllowPolicy says which queues may use this one as their dead-letter
// queue: RedrivePermission is allowAll, denyAll or byQueue (then SourceQueues,
// by role).
type RedriveAllowPolicy struct {
	RedrivePermission string   `json:"redrivePermission"`
	SourceQueues      []string `json:"sourceQueues,omitempty"`
}

// The embedded file is fixed at build time and covered by the package's tests,
// so a broken one is a build mistake, not a run-time condition.
var definitions = func() Queues {
	d, err := parseDefinitions(queuesJSON)
	if err != nil {
		panic("localstack: embedded queues.json: " + err.Error())
	}
	return d
}()

// Definitions returns the queue definitions from queues.json. The result is a
// copy the caller may change.
func Definitions() Queues {
	return Queues{
		Work:    definitions.Work.clone(),
		Results: definitions.Results.clone(),
		DLQ:     definitions.DLQ.clone(),
	}
}

// Role returns the definition of the queue with the given role.
func (d Queues) Role(role string) (Queue, bool) {
	switch role {
	case RoleWork:
		return d.Work, true
	case RoleResults:
		return d.Results, true
	case RoleDLQ:
		return d.DLQ, true
	}
	return Queue{}, false
}

func (q Queue) clone() Queue {
	q.Attributes = maps.Clone(q.Attributes)
	if q.RedrivePolicy != nil {
		p := *q.RedrivePolicy
		q.RedrivePolicy = &p
	}
	if q.RedriveAllowPolicy != nil {
		p := *q.RedriveAllowPolicy
		p.SourceQueues = slices.Clone(p.SourceQueues)
		q.RedriveAllowPolicy = &p
	}
	return q
}

// attributeRanges are the attributes queues.json may set, with the ranges SQS
// accepts, so a typo or an out-of-range value fails the build's tests instead
// of a deployment.
var attributeRanges = map[string][2]int{
	"DelaySeconds":                  {0, seconds(job.MaxDelay)},
	"MaximumMessageSize":            {job.MinMessageBytes, job.MaxMessageBytes},
	"MessageRetentionPeriod":        {60, 1209600},
	"ReceiveMessageWaitTimeSeconds": {0, seconds(job.MaxLongPoll)},
	"VisibilityTimeout":             {0, seconds(job.MaxVisibility)},
}

func seconds(d time.Duration) int { return int(d / time.Second) }

// maxReceiveCountRange is what SQS accepts in a RedrivePolicy.
var maxReceiveCountRange = [2]int{1, 1000}

func parseDefinitions(data []byte) (Queues, error) {
	var file struct {
		Description string           `json:"description"`
		Queues      map[string]Queue `json:"queues"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return Queues{}, err
	}
	var errs []error
	for role := range file.Queues {
		if !slices.Contains(creationOrder, role) {
			errs = append(errs, fmt.Errorf("unknown queue role %q (want %v)", role, creationOrder))
		}
	}
	created := map[string]bool{}
	for _, role := range creationOrder {
		q, ok := file.Queues[role]
		if !ok {
			errs = append(errs, fmt.Errorf("queue %q missing", role))
			continue
		}
		if err := q.validate(file.Queues, created); err != nil {
			errs = append(errs, fmt.Errorf("queue %q: %w", role, err))
		}
		created[role] = true
	}
	// The work queue without a dead-letter queue would retry a poison message
	// forever; Options.MaxReceiveCount also relies on the policy being there.
	if w, ok := file.Queues[RoleWork]; ok && w.RedrivePolicy == nil {
		errs = append(errs, errors.New(`queue "work": no redrivePolicy`))
	}
	if err := errors.Join(errs...); err != nil {
		return Queues{}, err
	}
	return Queues{
		Work:    file.Queues[RoleWork],
		Results: file.Queues[RoleResults],
		DLQ:     file.Queues[RoleDLQ],
	}, nil
}

func (q Queue) validate(all map[string]Queue, created map[string]bool) error {
	var errs []error
	if q.Name == "" {
		errs = append(errs, errors.New("no name"))
	} else if err := validateName(q.Name); err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(q.Attributes)) {
		r, ok := attributeRanges[name]
		if !ok {
			errs = append(errs, fmt.Errorf("attribute %s is not one queues.json may set (redrive policies have their own fields)", name))
			continue
		}
		if err := checkInt(name, q.Attributes[name], r); err != nil {
			errs = append(errs, err)
		}
	}
	if p := q.RedrivePolicy; p != nil {
		if _, ok := all[p.DeadLetterQueue]; !ok {
			errs = append(errs, fmt.Errorf("redrivePolicy: unknown deadLetterQueue %q", p.DeadLetterQueue))
		} else if !created[p.DeadLetterQueue] {
			errs = append(errs, fmt.Errorf("redrivePolicy: deadLetterQueue %q is created after this queue (order %v)",
				p.DeadLetterQueue, creationOrder))
		}
		if err := checkInt("redrivePolicy.maxReceiveCount", strconv.Itoa(p.MaxReceiveCount), maxReceiveCountRange); err != nil {
			errs = append(errs, err)
		}
	}
	if p := q.RedriveAllowPolicy; p != nil {
		switch p.RedrivePermission {
		case "allowAll", "denyAll":
			if len(p.SourceQueues) > 0 {
				errs = append(errs, fmt.Errorf("redriveAllowPolicy: sourceQueues needs redrivePermission byQueue, not %s", p.RedrivePermission))
			}
		case "byQueue":
			if len(p.SourceQueues) == 0 || len(p.SourceQueues) > 10 {
				errs = append(errs, errors.New("redriveAllowPolicy: byQueue needs 1 to 10 sourceQueues"))
			}
			for _, s := range p.SourceQueues {
				if _, ok := all[s]; !ok {
					errs = append(errs, fmt.Errorf("redriveAllowPolicy: unknown source queue %q", s))
				}
			}
		default:
			errs = append(errs, fmt.Errorf("redriveAllowPolicy: redrivePermission %q is not allowAll, denyAll or byQueue", p.RedrivePermission))
		}
	}
	return errors.Join(errs...)
}

// checkInt insists on the canonical form because SQS hands values back that
// way, and a definition that reads "030" would never compare equal.
func checkInt(name, value string, r [2]int) error {
	n, err := strconv.Atoi(value)
	if err != nil || strconv.Itoa(n) != value {
		return fmt.Errorf("%s = %q: not a plain integer", name, value)
	}
	if n < r[0] || n > r[1] {
		return fmt.Errorf("%s = %d: outside %d..%d", name, n, r[0], r[1])
	}
	return nil
}

// validateName applies SQS's rule for standard queue names.
func validateName(name string) error {
	if len(name) == 0 || len(name) > 80 {
		return fmt.Errorf("queue name %q: must be 1 to 80 characters", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("queue name %q: only letters, digits, '-' and '_' are allowed", name)
		}
	}
	return nil
}
