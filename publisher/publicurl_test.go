package publisher

import (
	"errors"
	"testing"
)

// PublicURL is an origin that an edge serves the bucket's keys at the root
// of: anything else would send a download where no edge routes it, so it is
// refused at start, by its field, rather than at the first large download.
func TestPublicURLMustBeAnOrigin(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"", true},
		{"https://d111111abcdef8.cloudfront.net", true},
		{"https://api.example.com/", true},
		{"http://127.0.0.1:8080", true},
		{"d111111abcdef8.cloudfront.net", false}, // no scheme
		{"ftp://example.com", false},
		{"https://", false},
		{"https://example.com/v1", false},
		{"https://example.com?x=1", false},
		{"https://example.com#top", false},
		{"https://user:pw@example.com", false},
		{"https://exa mple.com", false},
	} {
		c := Config{Queue: &countingQueue{}, PublicURL: tc.url}
		c.setDefaults()
		err := c.Validate()
		var fe *FieldError
		switch {
		case tc.ok && err != nil:
			t.Errorf("PublicURL %q: %v; want taken", tc.url, err)
		case !tc.ok && (!errors.As(err, &fe) || fe.Field != "PublicURL"):
			t.Errorf("PublicURL %q: %v; want refused, by the field PublicURL", tc.url, err)
		}
	}
}
