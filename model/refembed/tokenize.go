package refembed

import (
	"iter"
	"unicode"
	"unicode/utf8"

	"github.com/vramq/vramq/job"
)

// The reference model's tokenizer is a hashing bag-of-words: no vocabulary
// file, the same ids on every machine, and a token count that Cost can get by
// scanning the text once without allocating.

// emptyToken stands for an item with no words, so that every item, even an
// empty or binary one, has an embedding.
const emptyToken = 0

// FNV-1a, 64-bit.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// words yields the FNV-1a hash of each word of text, lower-cased. A word is
// a run of letters, digits and combining marks (marks so that scripts which
// write vowels as marks, like Devanagari, and decomposed accents keep words
// whole). Han, Hiragana and Katakana characters are one word each, because
// those scripts do not put spaces between words. Anything else separates
// words; invalid UTF-8 reads as U+FFFD and so separates too.
func words(text string) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		h, inWord := uint64(fnvOffset), false
		for _, r := range text {
			if r < utf8.RuneSelf {
				// Most text is ASCII, where the unicode tables cost most
				// of the scan: the same classes by comparison.
				switch b, ok := asciiWordByte(r); {
				case ok:
					h, inWord = (h^uint64(b))*fnvPrime, true
				case inWord:
					if !yield(h) {
						return
					}
					h, inWord = fnvOffset, false
				}
				continue
			}
			switch {
			case unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana):
				if inWord && !yield(h) {
					return
				}
				if !yield(hashRune(fnvOffset, r)) {
					return
				}
				h, inWord = fnvOffset, false
			case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				h, inWord = hashRune(h, unicode.ToLower(r)), true
			case inWord:
				if !yield(h) {
					return
				}
				h, inWord = fnvOffset, false
			}
		}
		if inWord {
			yield(h)
		}
	}
}

// asciiWordByte is, for an ASCII r, whether it belongs in a word (a letter
// or digit: no ASCII rune is a mark) and its lower case, as words' general
// path would take it.
func asciiWordByte(r rune) (byte, bool) {
	switch {
	case 'a' <= r && r <= 'z' || '0' <= r && r <= '9':
		return byte(r), true
	case 'A' <= r && r <= 'Z':
		return byte(r - 'A' + 'a'), true
	}
	return 0, false
}

// hashRune feeds r's UTF-8 bytes into the FNV-1a state h.
func hashRune(h uint64, r rune) uint64 {
	var buf [utf8.UTFMax]byte
	for _, b := range buf[:utf8.EncodeRune(buf[:], r)] {
		h ^= uint64(b)
		h *= fnvPrime
	}
	return h
}

// CountTokens is how many tokens c's tokenizer reads from text (at most
// MaxTokens): len(c.appendTokens(nil, text)) without building the slice.
func (c Config) CountTokens(text string) int {
	n := 0
	for range words(text) {
		if n++; n == c.MaxTokens {
			break
		}
	}
	return max(n, 1)
}

// appendTokens appends the token ids of text to dst: one per word, in
// [1, Vocab), truncated to MaxTokens as real tokenizers truncate to their
// context; or the single id 0 when text has no words.
func (c Config) appendTokens(dst []int32, text string) []int32 {
	start := len(dst)
	for h := range words(text) {
		dst = append(dst, int32(1+h%uint64(c.Vocab-1)))
		if len(dst)-start == c.MaxTokens {
			break
		}
	}
	if len(dst) == start {
		dst = append(dst, emptyToken)
	}
	return dst
}

// Tokenize returns the token ids of items as one flat slice, with offsets[i]
// the start of item i's ids and offsets[len(items)] their total: the layout
// a device batch uploads (the tokenizer runs on the host in every backend,
// so all backends see the same ids). It is what Run computes first.
func (c Config) Tokenize(items []job.Item) (tokens, offsets []int32) {
	offsets = make([]int32, len(items)+1)
	n := 0
	for _, it := range items {
		n += c.CountTokens(it.Text)
	}
	tokens = make([]int32, 0, n)
	for i, it := range items {
		offsets[i] = int32(len(tokens))
		tokens = c.appendTokens(tokens, it.Text)
	}
	offsets[len(items)] = int32(len(tokens))
	return tokens, offsets
}
