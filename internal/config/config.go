// Package config is what vramq's Config structs share: defaults for the
// fields left zero, and the problems Validate finds, each naming the field it
// is about so that a command can name its own flag (and environment
// variable) for each one.
package config

import (
	"errors"
	"fmt"
)

// FieldError is one problem Validate found, with the name of the Config
// field it is about.
type FieldError struct {
	Field string // a Config field, e.g. "MaxItems"
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Problems gathers FieldErrors so that Validate reports every problem at
// once rather than the first; its zero value is ready to use.
type Problems struct{ errs []error }

// Add records a problem with field, its message formatted as by fmt.Errorf.
func (p *Problems) Add(field, format string, a ...any) {
	p.errs = append(p.errs, &FieldError{Field: field, Err: fmt.Errorf(format, a...)})
}

// Err is every problem added, joined, or nil when there is none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// OrDefault sets *p to def when it is the zero value, so that a Config
// literal need name only what it changes.
func OrDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// AtLeast adds a problem with field when v, what the field sets, is below
// min: "max items 0: want at least 1".
func AtLeast[T ~int | ~int64](p *Problems, field, what string, v, min T) {
	if v < min {
		// min with %d: a Duration's bound reads "0", as a count's does.
		p.Add(field, "%s %v: want at least %d", what, v, min)
	}
}
