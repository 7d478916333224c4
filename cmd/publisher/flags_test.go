package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/vramq/vramq/publisher"
)

// ownDefaults are the publisher.Config fields whose flag has a default of
// the binary's own rather than DefaultConfig's, each with it.
var ownDefaults = map[string]any{
	"MaxMessageBytes": 0, // the queue's MaximumMessageSize, read at start
	"RateLimit":       float64(defaultRateLimit),
	"RateBurst":       defaultRateBurst,
	"GlobalRateLimit": float64(defaultGlobalRateLimit),
	"GlobalRateBurst": defaultGlobalRateBurst,
}

// noFlag lists the publisher.Config fields DefaultConfig sets that no flag
// does, each with the reason.
var noFlag = map[string]string{
	"SendBackoff":        "set only by tests and benchmarks; the SDK's retryer backs off the calls themselves",
	"SendConcurrency":    "set only by benchmarks (harness/cmd/bench); a FIFO queue forces 1 anyway",
	"IdempotencyTTL":     "bounds the in-memory records kept without a bucket, which is for development",
	"IdempotencyEntries": "bounds the in-memory records kept without a bucket, which is for development",
	"IdempotencyStale":   "outlasts a request's enqueue timeout (90 s), which is no setting either",
}

// The flags start from publisher.DefaultConfig: with none given, every
// field a flag sets holds its default (or the binary's own, in
// ownDefaults), and every field DefaultConfig sets has a flag, or a reason
// in noFlag.
func TestFlagDefaultsAreDefaultConfig(t *testing.T) {
	o, err := parse(nil, env(map[string]string{"QUEUE_URL": "http://q"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fs := newFlagSet(&options{}, io.Discard)
	got, want := reflect.ValueOf(o.cfg), reflect.ValueOf(publisher.DefaultConfig())
	// The fields of an embedded struct (publisher.Jobs) are Config's own,
	// each with its flag; the struct itself is none.
	for _, sf := range reflect.VisibleFields(want.Type()) {
		if sf.Anonymous {
			continue
		}
		field, wantField, gotField := sf.Name, want.FieldByIndex(sf.Index), got.FieldByIndex(sf.Index)
		name, ok := configFlags[field]
		w := wantField.Interface()
		if d, own := ownDefaults[field]; own {
			w = d
		}
		switch {
		case ok && fs.Lookup(name) == nil:
			t.Errorf("configFlags maps %s to -%s, which is no flag", field, name)
		case ok && !reflect.DeepEqual(gotField.Interface(), w):
			t.Errorf("-%s defaults to %v; want %v (publisher.DefaultConfig().%s, or ownDefaults)", name, gotField, w, field)
		case !ok && !wantField.IsZero() && noFlag[field] == "":
			t.Errorf("publisher.DefaultConfig sets %s, which no flag sets (add one, or say why not in noFlag)", field)
		}
	}
}
