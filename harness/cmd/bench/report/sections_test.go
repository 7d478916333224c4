package report

import "testing"

func TestReplaceSection(t *testing.T) {
	begin, end := sectionMarkers("rss")
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"empty file", "", begin + "\nnew\n" + end + "\n"},
		{"appended after prose", "# Title\nprose", "# Title\nprose\n\n" + begin + "\nnew\n" + end + "\n"},
		{"replaced, prose kept", "# T\n" + begin + "\nold\nlines\n" + end + "\nafter\n", "# T\n" + begin + "\nnew\n" + end + "\nafter\n"},
		{"other sections kept", "a\n<!-- bench overhead: x -->\n" + begin + "\nold\n" + end + "\n",
			"a\n<!-- bench overhead: x -->\n" + begin + "\nnew\n" + end + "\n"},
	} {
		got, err := replaceSection(tc.doc, "rss", "new\n\n")
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := replaceSection(end+"\n"+begin+"\n", "rss", "x"); err == nil {
		t.Error("markers in the wrong order accepted")
	}
	if _, err := replaceSection(begin+"\n", "rss", "x"); err == nil {
		t.Error("a begin marker without its end accepted")
	}
}
