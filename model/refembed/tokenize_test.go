package refembed

import (
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/vramq/vramq/job"
)

func TestTokenize(t *testing.T) {
	cfg := DefaultConfig()
	tokens := func(s string) []int32 { return cfg.appendTokens(nil, s) }
	tests := []struct {
		text  string
		count int
		same  string // tokenizes the same, if set
	}{
		{"", 1, "!!! ... ???"},
		{"hello", 1, "HELLO"},
		{"Hello, World!", 2, "hello world"},
		{"  hello\tworld\n", 2, "hello world"},
		{"don't", 2, "don t"},
		{"gpu-01 x86_64", 4, "gpu 01 x86 64"},
		{"Naïve CAFÉ", 2, "naïve café"},
		{"Cafe\u0301", 1, "cafe\u0301"}, // a combining accent stays in its word
		{"हिन्दी भाषा", 2, ""},          // Devanagari vowel signs are marks
		{"東京タワー", 5, "東 京 タ ワ ー"},       // one token per ideograph or kana
		{"GPU東京", 3, "gpu 東 京"},
		{"Ünïcödé ΚΑΛΗΜΈΡΑ", 2, "ünïcödé καλημέρα"},
		{"bad \xff utf8", 2, "bad utf8"},
	}
	for _, tt := range tests {
		got := tokens(tt.text)
		if len(got) != tt.count {
			t.Errorf("%q: %d tokens %v, want %d", tt.text, len(got), got, tt.count)
		}
		if n := cfg.CountTokens(tt.text); n != len(got) {
			t.Errorf("%q: CountTokens = %d, appendTokens made %d", tt.text, n, len(got))
		}
		if tt.same != "" && !slices.Equal(got, tokens(tt.same)) {
			t.Errorf("%q tokenizes as %v, %q as %v; want the same", tt.text, got, tt.same, tokens(tt.same))
		}
		for _, id := range got {
			if id < 0 || int(id) >= cfg.Vocab || (id == emptyToken && len(got) > 1) {
				t.Errorf("%q: token id %d out of range", tt.text, id)
			}
		}
	}
	if got := tokens("!?"); !slices.Equal(got, []int32{emptyToken}) {
		t.Errorf("no words: %v, want [%d]", got, emptyToken)
	}
	if a, b := tokens("cat dog"), tokens("dog cat"); a[0] != b[1] || a[1] != b[0] {
		t.Errorf("a word's id depends on its position: %v, %v", a, b)
	}
}

func TestTokenizeTruncates(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTokens = 3
	got := cfg.appendTokens([]int32{7}, "one two three four five")
	want := append([]int32{7}, DefaultConfig().appendTokens(nil, "one two three")...)
	if !slices.Equal(got, want) {
		t.Errorf("appendTokens = %v, want %v", got, want)
	}
	if n := cfg.CountTokens(strings.Repeat("word ", 1000)); n != 3 {
		t.Errorf("CountTokens of 1000 words = %d, want 3", n)
	}
}

func BenchmarkCountTokens(b *testing.B) {
	cfg := DefaultConfig()
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		cfg.CountTokens(text)
	}
}

func TestTokenizeMatchesCountAndAppend(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTokens = 3
	items := []job.Item{{Text: "one two"}, {Text: ""}, {Text: "a b c d e"}, {Text: "日本"}}
	tokens, offsets := cfg.Tokenize(items)
	if len(offsets) != len(items)+1 || offsets[0] != 0 || int(offsets[len(items)]) != len(tokens) {
		t.Fatalf("offsets %v for %d tokens", offsets, len(tokens))
	}
	for i, it := range items {
		got := tokens[offsets[i]:offsets[i+1]]
		want := cfg.appendTokens(nil, it.Text)
		if !slices.Equal(got, want) || len(got) != cfg.CountTokens(it.Text) {
			t.Errorf("item %d (%q): ids %v, want %v (count %d)", i, it.Text, got, want, cfg.CountTokens(it.Text))
		}
	}
	if n := offsets[3] - offsets[2]; n != 3 {
		t.Errorf("a five-word text with MaxTokens 3 has %d ids, want 3", n)
	}
}

// The ASCII fast path takes every ASCII rune as the Unicode classes and
// case mapping of words' general path do, so ids do not change with it.
func TestASCIIWordByteMatchesUnicode(t *testing.T) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		b, ok := asciiWordByte(r)
		want := unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
		if ok != want {
			t.Errorf("%q: in a word %v, want %v", r, ok, want)
		}
		if ok && hashRune(fnvOffset, rune(b)) != hashRune(fnvOffset, unicode.ToLower(r)) {
			t.Errorf("%q: lower case %q, want %q", r, b, unicode.ToLower(r))
		}
	}
}
