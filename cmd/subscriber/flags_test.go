package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/vramq/vramq/subscriber"
)

// noFlag lists the subscriber.Config fields DefaultConfig sets that no flag
// does, each with the reason.
var noFlag = map[string]string{
	"MaxResultBytes": "its default is also its maximum, the most the publisher reads; only tests set it lower",
}

// The flags start from subscriber.DefaultConfig: with none given, every
// field a flag sets holds its default, and every field DefaultConfig sets
// has a flag, or a reason in noFlag.
func TestFlagDefaultsAreDefaultConfig(t *testing.T) {
	env := map[string]string{"QUEUE_URL": "q", "RESULTS_QUEUE_URL": "r", "DLQ_URL": "d"}
	o, err := parse(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fs := newFlagSet(&options{}, io.Discard)
	got, want := reflect.ValueOf(o.cfg), reflect.ValueOf(subscriber.DefaultConfig())
	for i := range want.NumField() {
		field := want.Type().Field(i).Name
		name, ok := configFlags[field]
		switch {
		case ok && fs.Lookup(name) == nil:
			t.Errorf("configFlags maps %s to -%s, which is no flag", field, name)
		case ok && !reflect.DeepEqual(got.Field(i).Interface(), want.Field(i).Interface()):
			t.Errorf("-%s defaults to %v; subscriber.DefaultConfig().%s is %v", name, got.Field(i), field, want.Field(i))
		case !ok && !want.Field(i).IsZero() && noFlag[field] == "":
			t.Errorf("subscriber.DefaultConfig sets %s, which no flag sets (add one, or say why not in noFlag)", field)
		}
	}
}
