package report

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// Sections of a markdown file that a command rewrites keep to their
// markers; the prose around them is left alone.
func sectionMarkers(name string) (begin, end string) {
	return "<!-- bench " + name + ": begin (written by the command; edits here are overwritten) -->",
		"<!-- bench " + name + ": end -->"
}

// replaceSection puts body between name's markers in doc, or appends the
// markers and body when doc has none.
func replaceSection(doc, name, body string) (string, error) {
	begin, end := sectionMarkers(name)
	body = strings.TrimRight(body, "\n") + "\n"
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	switch {
	case i < 0 && j < 0:
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		if doc != "" {
			doc += "\n"
		}
		return doc + begin + "\n" + body + end + "\n", nil
	case i < 0 || j < i:
		return "", fmt.Errorf("the %q markers are out of order or one is missing", name)
	}
	return doc[:i+len(begin)] + "\n" + body + doc[j:], nil
}

// updateSection rewrites section name of the markdown file at path.
func updateSection(path, name, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	doc, err := replaceSection(string(old), name, body)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
