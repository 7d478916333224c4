package publisher

import (
	"reflect"
	"testing"
)

// Each setting of the gate is declared once, in api.Config: a field of the
// same name declared in Config itself would shadow the embedded one, and
// New would hand the gate a value no flag or caller set.
func TestAPISettingsHaveOneDeclaration(t *testing.T) {
	cfg := reflect.TypeFor[Config]()
	apiField, ok := cfg.FieldByName("API")
	if !ok || !apiField.Anonymous {
		t.Fatal("Config does not embed API")
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[API]()) {
		got, ok := cfg.FieldByName(f.Name)
		if !ok {
			t.Errorf("Config.%s is ambiguous or missing: want the one of the embedded API", f.Name)
			continue
		}
		if len(got.Index) != 2 || got.Index[0] != apiField.Index[0] {
			t.Errorf("Config.%s is declared outside the embedded API (index %v): one declaration, in api.Config", f.Name, got.Index)
		}
	}
}
