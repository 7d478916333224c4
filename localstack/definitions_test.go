package localstack

import (
	"strings"
	"testing"
	"time"
)

func TestDefinitions(t *testing.T) {
	d := Definitions()
	checks := []struct {
		what, got, want string
	}{
		{"work name", d.Work.Name, "vramq-work"},
		{"results name", d.Results.Name, "vramq-results"},
		{"dlq name", d.DLQ.Name, "vramq-dlq"},
		{"work VisibilityTimeout", d.Work.Attributes["VisibilityTimeout"], "30"},
		{"work ReceiveMessageWaitTimeSeconds", d.Work.Attributes["ReceiveMessageWaitTimeSeconds"], "20"},
		{"work MessageRetentionPeriod", d.Work.Attributes["MessageRetentionPeriod"], "345600"},
		{"work MaximumMessageSize", d.Work.Attributes["MaximumMessageSize"], "1048576"},
		{"results MessageRetentionPeriod", d.Results.Attributes["MessageRetentionPeriod"], "345600"},
		{"dlq MessageRetentionPeriod", d.DLQ.Attributes["MessageRetentionPeriod"], "1209600"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if p := d.Work.RedrivePolicy; p == nil || p.DeadLetterQueue != RoleDLQ || p.MaxReceiveCount != 5 {
		t.Errorf("work redrive policy = %+v, want dlq after 5 receives", p)
	}
	if p := d.DLQ.RedriveAllowPolicy; p == nil || p.RedrivePermission != "byQueue" || len(p.SourceQueues) != 1 || p.SourceQueues[0] != RoleWork {
		t.Errorf("dlq redrive allow policy = %+v, want byQueue [work]", p)
	}
}

func TestDefinitionsIsACopy(t *testing.T) {
	d := Definitions()
	d.Work.Attributes["VisibilityTimeout"] = "999"
	d.Work.RedrivePolicy.MaxReceiveCount = 999
	d.DLQ.RedriveAllowPolicy.SourceQueues[0] = "x"
	again := Definitions()
	if again.Work.Attributes["VisibilityTimeout"] != "30" || again.Work.RedrivePolicy.MaxReceiveCount != 5 || again.DLQ.RedriveAllowPolicy.SourceQueues[0] != RoleWork {
		t.Error("changing the result of Definitions changed the package's definitions")
	}
}

func TestParseDefinitionsRejects(t *testing.T) {
	const valid = `{"queues": {
		"work": {"name": "w", "attributes": {"VisibilityTimeout": "30"}, "redrivePolicy": {"deadLetterQueue": "dlq", "maxReceiveCount": 5}},
		"results": {"name": "r"},
		"dlq": {"name": "d", "redriveAllowPolicy": {"redrivePermission": "byQueue", "sourceQueues": ["work"]}}}}`
	if _, err := parseDefinitions([]byte(valid)); err != nil {
		t.Fatalf("valid definitions rejected: %v", err)
	}
	tests := []struct {
		name, replace, with, wantErr string
	}{
		{"unknown field", `"name": "r"`, `"name": "r", "nmae": "x"`, "nmae"},
		{"missing queue", `"results": {"name": "r"},`, ``, `"results" missing`},
		{"unknown role", `"results": {"name": "r"},`, `"results": {"name": "r"}, "extra": {"name": "e"},`, `unknown queue role "extra"`},
		{"bad name", `"name": "r"`, `"name": "r.fifo"`, "only letters"},
		{"unknown attribute", `"VisibilityTimeout": "30"`, `"VisibiltyTimeout": "30"`, "VisibiltyTimeout"},
		{"redrive as attribute", `"VisibilityTimeout": "30"`, `"RedrivePolicy": "{}"`, "RedrivePolicy"},
		{"not canonical", `"VisibilityTimeout": "30"`, `"VisibilityTimeout": "030"`, "not a plain integer"},
		{"out of range", `"VisibilityTimeout": "30"`, `"VisibilityTimeout": "50000"`, "outside"},
		{"work without redrive", `, "redrivePolicy": {"deadLetterQueue": "dlq", "maxReceiveCount": 5}`, ``, `"work": no redrivePolicy`},
		{"receive count", `"maxReceiveCount": 5`, `"maxReceiveCount": 0`, "maxReceiveCount"},
		{"unknown target", `"deadLetterQueue": "dlq"`, `"deadLetterQueue": "dead"`, "unknown deadLetterQueue"},
		{"target created later", `"deadLetterQueue": "dlq"`, `"deadLetterQueue": "results"`, "created after"},
		{"permission", `"redrivePermission": "byQueue"`, `"redrivePermission": "some"`, "redrivePermission"},
		{"unknown source", `"sourceQueues": ["work"]`, `"sourceQueues": ["wrk"]`, "unknown source queue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := strings.Replace(valid, tt.replace, tt.with, 1)
			if doc == valid {
				t.Fatalf("test case does not change the document: %q not found", tt.replace)
			}
			_, err := parseDefinitions([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestOptionsApply(t *testing.T) {
	d, err := Options{Prefix: "p-", MaxReceiveCount: 7, VisibilityTimeout: 2 * time.Minute}.apply(Definitions())
	if err != nil {
		t.Fatal(err)
	}
	if d.Work.Name != "p-vramq-work" || d.Results.Name != "p-vramq-results" || d.DLQ.Name != "p-vramq-dlq" {
		t.Errorf("names = %s %s %s, want the prefix on each", d.Work.Name, d.Results.Name, d.DLQ.Name)
	}
	if got := d.Work.Attributes["VisibilityTimeout"]; got != "120" {
		t.Errorf("work VisibilityTimeout = %s, want 120", got)
	}
	if got := d.Work.RedrivePolicy.MaxReceiveCount; got != 7 {
		t.Errorf("maxReceiveCount = %d, want 7", got)
	}
	if Definitions().Work.Attributes["VisibilityTimeout"] != "30" {
		t.Error("apply changed the package's definitions")
	}

	for _, o := range []Options{
		{Prefix: "a.b"},
		{Prefix: strings.Repeat("x", 70)},
		{MaxReceiveCount: -1},
		{MaxReceiveCount: 1001},
		{VisibilityTimeout: 1500 * time.Millisecond},
		{VisibilityTimeout: -time.Second},
		{VisibilityTimeout: 13 * time.Hour},
	} {
		if _, err := o.apply(Definitions()); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func TestDifferences(t *testing.T) {
	want := map[string]string{
		"VisibilityTimeout":  "30",
		"RedrivePolicy":      `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d","maxReceiveCount":5}`,
		"RedriveAllowPolicy": `{"redrivePermission":"byQueue","sourceQueueArns":["a","b"]}`,
	}
	same := map[string]string{
		"VisibilityTimeout":  "30",
		"QueueArn":           "arn:aws:sqs:us-east-1:1:w",
		"RedrivePolicy":      `{"maxReceiveCount":"5", "deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d"}`,
		"RedriveAllowPolicy": `{"sourceQueueArns":["b","a"],"redrivePermission":"byQueue"}`,
	}
	if d := differences(want, same); len(d) != 0 {
		t.Errorf("differences for equal attributes: %v", d)
	}
	other := map[string]string{
		"RedrivePolicy":      `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d","maxReceiveCount":6}`,
		"RedriveAllowPolicy": `{"redrivePermission":"allowAll"}`,
	}
	d := differences(want, other)
	if len(d) != 3 {
		t.Fatalf("differences = %v, want three", d)
	}
	for i, prefix := range []string{"RedriveAllowPolicy is", "RedrivePolicy is", "VisibilityTimeout is not set"} {
		if !strings.HasPrefix(d[i], prefix) {
			t.Errorf("difference %d = %q, want it to start %q", i, d[i], prefix)
		}
	}
}
