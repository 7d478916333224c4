package wordpiece

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"
)

// Tokenizer is the WordPiece tokenizer of a BERT-family model, as Hugging Face's
// tokenizers library runs it: BertNormalizer, BertPreTokenizer, WordPiece, then the
// post-processor's special tokens ([CLS] … [SEP]). Added tokens (the special ones such
// as [MASK] among them) are matched in the text first, as that library does.
//
// A Tokenizer is immutable after Load and safe for concurrent use.
type Tokenizer struct {
	// vocab finds the pieces that start a word; cont those that continue one,
	// without their "##" prefix.
	vocab, cont *pieceTrie
	unk         int32
	maxChars    int // a word of more characters is one unk

	cleanText, chinese, stripAccents, lowercase bool

	// raw is matched in the text as given, normalized in the normalized text.
	raw, normalized addedTokens

	prefix, suffix []int32 // the post-processor's tokens around the sequence
	vocabSize      int
	specials       Specials
}

// Specials holds the ids of a tokenizer's special tokens; -1 where it has none.
type Specials struct {
	CLS, SEP, PAD, UNK, MASK int32
}

// VocabSize is the number of token ids, added tokens included: every id Encode
// returns is below it (the size of the model's word-embedding table).
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// Specials returns the ids of the special tokens.
func (t *Tokenizer) Specials() Specials { return t.specials }

// NumSpecial is the number of tokens Encode adds around the text ([CLS] and [SEP]).
func (t *Tokenizer) NumSpecial() int { return len(t.prefix) + len(t.suffix) }

// Encode returns the token ids of text with the special tokens around them. When
// maxLen > 0, the result has at most maxLen ids: the text's tokens are cut at the
// end and the special tokens kept, as Hugging Face's tokenizers truncate a single
// sequence (LongestFirst, direction right). A maxLen below NumSpecial is taken as
// NumSpecial (the Rust library returns more ids than asked in that case).
//
// The attention mask is all ones over the result. Invalid UTF-8 reads as U+FFFD,
// as a lossy UTF-8 decoding gives it, which the normalizer removes.
func (t *Tokenizer) Encode(text string, maxLen int) []int32 {
	n := len(text)/3 + t.NumSpecial() + 1
	if maxLen > 0 && n > maxLen {
		n = maxLen
	}
	return t.AppendEncode(make([]int32, 0, n), text, maxLen)
}

// AppendEncode is Encode appending to dst, so that a caller can reuse one slice.
func (t *Tokenizer) AppendEncode(dst []int32, text string, maxLen int) []int32 {
	limit := -1 // the text's tokens to keep, -1 for all
	if maxLen > 0 {
		limit = max(maxLen-t.NumSpecial(), 0)
	}
	dst = append(dst, t.prefix...)
	start := len(dst)
	if limit != 0 {
		s := tokScratchPool.Get().(*tokScratch)
		dst = t.appendText(dst, text, start, limit, s)
		s.release()
	}
	if limit >= 0 && len(dst)-start > limit {
		dst = dst[:start+limit]
	}
	return append(dst, t.suffix...)
}

// tokScratch holds the buffers of one Encode call, pooled so that tokenizing
// allocates nothing but its result.
type tokScratch struct {
	norm, nfd, out []byte
	nfdIter        norm.Iter
}

var tokScratchPool = sync.Pool{New: func() any { return new(tokScratch) }}

func (s *tokScratch) release() {
	// A huge text should not pin its buffers for the life of the process.
	if cap(s.norm) > 1<<20 || cap(s.nfd) > 1<<20 || cap(s.out) > 1<<20 {
		return
	}
	tokScratchPool.Put(s)
}

// limitReached reports whether the text's tokens reached the limit, so that the rest of
// the text need not be tokenized.
func limitReached(dst []int32, start, limit int) bool { return limit >= 0 && len(dst)-start >= limit }

// appendText splits text at the added tokens matched as written, and tokenizes the
// pieces between them.
func (t *Tokenizer) appendText(dst []int32, text string, start, limit int, s *tokScratch) []int32 {
	for from := 0; from < len(text); {
		mStart, mEnd, id, ok := t.raw.next(text, from)
		if !ok {
			return t.appendPiece(dst, text[from:], start, limit, s)
		}
		dst = t.appendPiece(dst, text[from:mStart], start, limit, s)
		if limitReached(dst, start, limit) {
			return dst
		}
		dst = append(dst, id)
		from = mEnd
	}
	return dst
}

// appendPiece normalizes a piece of text without raw added tokens, splits it at
// the normalized added tokens, and tokenizes what lies between.
func (t *Tokenizer) appendPiece(dst []int32, piece string, start, limit int, s *tokScratch) []int32 {
	if piece == "" || limitReached(dst, start, limit) {
		return dst
	}
	if len(t.normalized.tokens) == 0 {
		// In chunks cut after ASCII whitespace, which ends a word whatever the
		// options and neither decomposes nor reorders: the buffers stay small, and
		// a truncated encoding stops normalizing a long text near where it stops.
		for piece != "" {
			chunk := piece
			if len(piece) > normChunk {
				if i := strings.IndexAny(piece[normChunk:], " \t\n\r"); i >= 0 {
					chunk = piece[:normChunk+i+1]
				}
			}
			dst = t.appendWords(dst, t.normalize(chunk, s), start, limit)
			if limitReached(dst, start, limit) {
				return dst
			}
			piece = piece[len(chunk):]
		}
		return dst
	}
	b := t.normalize(piece, s)
	text := string(b) // for the matcher; b[i:j] is the same bytes
	for from := 0; from < len(text); {
		mStart, mEnd, id, ok := t.normalized.next(text, from)
		if !ok {
			return t.appendWords(dst, b[from:], start, limit)
		}
		dst = t.appendWords(dst, b[from:mStart], start, limit)
		if limitReached(dst, start, limit) {
			return dst
		}
		dst = append(dst, id)
		from = mEnd
	}
	return dst
}

// normChunk is about how much of a text is normalized at a time.
const normChunk = 4096

// normalize applies the BertNormalizer to piece, into s's buffers: clean text
// (drop NUL, U+FFFD and control characters, map whitespace to a space), put spaces
// around CJK ideographs, strip accents (NFD, then drop nonspacing marks), lower-case.
// The order is the Rust library's: accents are stripped before lower-casing.
func (t *Tokenizer) normalize(piece string, s *tokScratch) []byte {
	b := s.norm[:0]
	ascii := true
	for i := 0; i < len(piece); {
		c := piece[i]
		if c < utf8.RuneSelf {
			i++
			if t.cleanText {
				if isASCIIControl(c) {
					continue
				}
				if isASCIISpace(c) {
					c = ' '
				}
			}
			b = append(b, c)
			continue
		}
		ascii = false
		r, size := utf8.DecodeRuneInString(piece[i:])
		i += size
		if t.cleanText {
			if r == utf8.RuneError || isControl(r) {
				continue
			}
			if unicode.IsSpace(r) {
				b = append(b, ' ')
				continue
			}
		}
		switch {
		case t.chinese && isChinese(r):
			b = append(b, ' ')
			b = append(b, piece[i-size:i]...)
			b = append(b, ' ')
		case r == utf8.RuneError: // an invalid byte, kept without clean_text
			b = utf8.AppendRune(b, r)
		default:
			b = append(b, piece[i-size:i]...)
		}
	}
	s.norm = b
	if ascii {
		if t.lowercase {
			for i, c := range b {
				if 'A' <= c && c <= 'Z' {
					b[i] = c + 'a' - 'A'
				}
			}
		}
		return b
	}
	if !t.stripAccents && !t.lowercase {
		return b
	}
	// NFD works on the runs of non-ASCII bytes alone: ASCII characters neither
	// decompose nor take part in the reordering of combining marks, so the NFD of
	// the whole is the runs' NFD between the ASCII bytes as they are.
	out := s.out[:0]
	for i := 0; i < len(b); {
		if c := b[i]; c < utf8.RuneSelf {
			if t.lowercase && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		j := i + 1
		for j < len(b) && b[j] >= utf8.RuneSelf {
			j++
		}
		run := b[i:j]
		if t.stripAccents && norm.NFD.QuickSpan(run) < len(run) {
			// norm.Iter, pooled with the buffers, where NFD.Append allocates
			// its reorder buffer on every call.
			d := s.nfd[:0]
			s.nfdIter.Init(norm.NFD, run)
			for !s.nfdIter.Done() {
				d = append(d, s.nfdIter.Next()...)
			}
			s.nfd, run = d, d
		}
		out = t.appendFolded(out, run)
		i = j
	}
	s.out = out
	return out
}

// appendFolded appends NFD text less its nonspacing marks (accents), lower-cased,
// as the case may be: the same as the Rust library's two passes, since lower-casing
// a character of NFD text that is no mark never yields a mark (İ, whose lower case
// has one, decomposes first).
func (t *Tokenizer) appendFolded(out, run []byte) []byte {
	for i := 0; i < len(run); {
		r, size := utf8.DecodeRune(run[i:])
		switch {
		case r < utf8.RuneSelf: // from the decomposition of a non-ASCII character
			c := byte(r)
			if t.lowercase && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			out = append(out, c)
		case t.stripAccents && isNonspacingMark(r):
		case !t.lowercase:
			out = append(out, run[i:i+size]...)
		case r == 'İ':
			// The one unconditional multi-rune lower case of Unicode's
			// SpecialCasing, which Rust's char::to_lowercase applies and Go's
			// unicode.ToLower (simple mappings) does not.
			out = append(out, "i\u0307"...)
		default:
			out = utf8.AppendRune(out, unicode.ToLower(r))
		}
		i += size
	}
	return out
}

// appendWords splits normalized text as BertPreTokenizer does — at whitespace, which
// it drops, and around each punctuation character, which is a word of its own — and
// appends the WordPiece ids of each word.
func (t *Tokenizer) appendWords(dst []int32, b []byte, start, limit int) []int32 {
	word := 0 // start of the current word
	for i := 0; i < len(b); {
		c := b[i]
		size := 1
		var space, punct bool
		if c < utf8.RuneSelf {
			space, punct = isASCIISpace(c), isASCIIPunct(c)
		} else {
			var r rune
			r, size = utf8.DecodeRune(b[i:])
			space, punct = unicode.IsSpace(r), isPunct(r)
		}
		if space || punct {
			if word < i {
				dst = t.appendWord(dst, b[word:i])
				if limitReached(dst, start, limit) {
					return dst
				}
			}
			if punct {
				dst = t.appendWord(dst, b[i:i+size])
				if limitReached(dst, start, limit) {
					return dst
				}
			}
			word = i + size
		}
		i += size
	}
	if word < len(b) {
		dst = t.appendWord(dst, b[word:])
	}
	return dst
}

// appendWord appends the WordPiece ids of one word: greedy longest match first,
// continuing pieces with the "##" prefix, and the whole word as unk when a part of it
// matches nothing or when it has more than maxChars characters.
func (t *Tokenizer) appendWord(dst []int32, w []byte) []int32 {
	if len(w) > t.maxChars && utf8.RuneCount(w) > t.maxChars {
		return append(dst, t.unk)
	}
	first := len(dst)
	for pos := 0; pos < len(w); {
		trie := t.vocab
		if pos > 0 {
			trie = t.cont
		}
		id, n, ok := trie.longest(w[pos:])
		if !ok {
			return append(dst[:first], t.unk)
		}
		dst = append(dst, id)
		pos += n
	}
	return dst
}

func isASCIISpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// isASCIIControl reports the ASCII characters the normalizer drops: NUL and the
// controls but tab, newline and carriage return, which are whitespace.
func isASCIIControl(c byte) bool {
	return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f
}

// isASCIIPunct is Rust's char::is_ascii_punctuation, which BERT counts as
// punctuation though Unicode files some of it ($+<=>^`|~) under symbols.
func isASCIIPunct(c byte) bool {
	return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~')
}

// isControl is the normalizer's control class: Unicode's Cc, Cf, Co and Cs
// categories except tab, newline and carriage return. Unassigned code points (Cn)
// stay, as the Rust library keeps them (checked against it).
func isControl(r rune) bool {
	switch {
	case r < utf8.RuneSelf:
		return isASCIIControl(byte(r))
	case r < 0xA0:
		return true // C1 controls
	case r < 0x600:
		return r == 0xAD // soft hyphen, the one format character below Arabic
	}
	// Cc lies below U+00A0 and Cs cannot be decoded from a Go string.
	return unicode.In(r, unicode.Cf, unicode.Co) && unicode.Is(unicode8, r)
}

// unicode8 holds the characters assigned in Unicode 8.0. The Rust library takes
// punctuation, control and nonspacing-mark classes from the unicode_categories
// crate, whose tables are Unicode 8.0's: a character assigned later is none of them
// there (a word character), whatever Go's newer tables say. The golden file's
// sweep of every such character checks this against the library.
var unicode8 = rangetable.Assigned("8.0.0")

// unicode8Override gives the class in Unicode 8.0 of the characters of 8.0 whose
// category has changed since in a way that matters here (found by the golden file's
// sweep; Unicode's release notes record the same changes).
func unicode8Override(r rune) (punct, mn, ok bool) {
	switch r {
	case 0x1734: // HANUNOO SIGN PAMUDPOD: Mn in 8.0, Mc since 14.0
		return false, true, true
	case 0x1885, 0x1886: // MONGOLIAN LETTER ALI GALI (THREE) BALUDA: Lo in 8.0, Mn since 9.0
		return false, false, true
	case 0xA9BD: // JAVANESE CONSONANT SIGN KERET: Mc in 8.0, Mn since 12.0
		return false, false, true
	case 0x111C9: // SHARADA SANDHI MARK: Po in 8.0, Mn since 11.0
		return true, false, true
	case 0x1171E: // AHOM CONSONANT SIGN MEDIAL RA: Mn in 8.0 and in Go's 15.0, Mc in Node's tables
		return false, true, true
	}
	return false, false, false
}

func isPunct(r rune) bool {
	if punct, _, ok := unicode8Override(r); ok {
		return punct
	}
	return unicode.IsPunct(r) && unicode.Is(unicode8, r)
}

func isNonspacingMark(r rune) bool {
	if _, mn, ok := unicode8Override(r); ok {
		return mn
	}
	return unicode.Is(unicode.Mn, r) && unicode.Is(unicode8, r)
}

// isChinese is the Rust library's CJK ideograph ranges (its 0x2B920 lower bound
// included, where Python's BERT has 0x2B820: checked against the Rust library).
func isChinese(r rune) bool {
	switch {
	case r < 0x3400:
		return false
	case r <= 0x4DBF:
		return true
	case r >= 0x4E00 && r <= 0x9FFF, r >= 0xF900 && r <= 0xFAFF:
		return true
	case r >= 0x20000 && r <= 0x2A6DF, r >= 0x2A700 && r <= 0x2B73F, r >= 0x2B740 && r <= 0x2B81F,
		r >= 0x2B920 && r <= 0x2CEAF, r >= 0x2F800 && r <= 0x2FA1F:
		return true
	}
	return false
}

// addedToken is a token matched in the text before the model sees it.
type addedToken struct {
	content    string // as matched: normalized for normalized tokens
	id         int32
	singleWord bool
}

// addedTokens finds added tokens in text as the Rust library's AddedVocabulary does:
// leftmost-longest, non-overlapping matches; a single_word token matched inside a
// word is skipped (its span is not searched again). Its lstrip and rstrip only move
// the whitespace beside a token into the token's span, and BertPreTokenizer drops
// whitespace anyway: they change no id (the golden variants with them check that),
// so they are not implemented.
type addedTokens struct {
	tokens []addedToken // longest first
	first  [256]bool    // first bytes of the tokens
	only   int          // the one first byte of all tokens, or -1
}

func newAddedTokens(tokens []addedToken) addedTokens {
	a := addedTokens{only: -1}
	for _, tok := range tokens {
		if tok.content == "" {
			continue
		}
		a.tokens = append(a.tokens, tok)
		a.first[tok.content[0]] = true
	}
	sort.SliceStable(a.tokens, func(i, j int) bool { return len(a.tokens[i].content) > len(a.tokens[j].content) })
	n := 0
	for c, ok := range a.first {
		if ok {
			n++
			a.only = c
		}
	}
	if n != 1 {
		a.only = -1
	}
	return a
}

// next returns the next match in text at or after from: its span and id.
func (a *addedTokens) next(text string, from int) (start, end int, id int32, ok bool) {
	if len(a.tokens) == 0 {
		return 0, 0, 0, false
	}
	for i := from; i < len(text); {
		if a.only >= 0 {
			j := strings.IndexByte(text[i:], byte(a.only))
			if j < 0 {
				return 0, 0, 0, false
			}
			i += j
		} else if !a.first[text[i]] {
			i++
			continue
		}
		tok, matched := a.longestAt(text, i)
		if !matched {
			i++
			continue
		}
		s, e := i, i+len(tok.content)
		if tok.singleWord && (endsWithWord(text[:s]) || startsWithWord(text[e:])) {
			i = e
			continue
		}
		return s, e, tok.id, true
	}
	return 0, 0, 0, false
}

func (a *addedTokens) longestAt(text string, i int) (addedToken, bool) {
	for _, tok := range a.tokens {
		if strings.HasPrefix(text[i:], tok.content) {
			return tok, true
		}
	}
	return addedToken{}, false
}

// isWordRune approximates the regex crate's Unicode \w (alphabetic, marks, decimal
// digits, connector punctuation, join controls), which single_word tokens test.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Nl, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, size := utf8.DecodeLastRuneInString(s)
	return size > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, size := utf8.DecodeRuneInString(s)
	return size > 0 && isWordRune(r)
}

// ---- loading ----------------------------------------------------------------

// ErrNoTokenizer means a directory holds neither tokenizer.json nor vocab.txt with
// tokenizer_config.json.
var ErrNoTokenizer = errors.New("no tokenizer.json, nor vocab.txt with tokenizer_config.json")

// Load loads the tokenizer of a model directory as Hugging Face's hub has it:
// tokenizer.json where there is one, else vocab.txt with tokenizer_config.json. It
// refuses, naming the file and field, anything but a BERT WordPiece tokenizer
// (another model type, normalizer, pre-tokenizer or post-processor) rather than
// produce ids the model was not trained on.
func Load(dir string) (*Tokenizer, error) {
	cfg, err := readTokenizerConfig(dir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err == nil {
		t, err := parseTokenizerJSON(data, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return t, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return loadVocabTxt(dir, cfg)
}

// tokenizerConfig is what tokenizer_config.json (and special_tokens_map.json) say
// that the tokenizer needs.
type tokenizerConfig struct {
	TokenizerClass       string          `json:"tokenizer_class"`
	DoLowerCase          *bool           `json:"do_lower_case"`
	StripAccents         *bool           `json:"strip_accents"`
	TokenizeChineseChars *bool           `json:"tokenize_chinese_chars"`
	DoBasicTokenize      *bool           `json:"do_basic_tokenize"`
	NeverSplit           []string        `json:"never_split"`
	UnkToken             json.RawMessage `json:"unk_token"`
	ClsToken             json.RawMessage `json:"cls_token"`
	SepToken             json.RawMessage `json:"sep_token"`
	PadToken             json.RawMessage `json:"pad_token"`
	MaskToken            json.RawMessage `json:"mask_token"`

	found bool // tokenizer_config.json is there
}

// readTokenizerConfig reads tokenizer_config.json, with special_tokens_map.json's names of
// the special tokens over its own as transformers does. Either may be missing (found
// says whether tokenizer_config.json is there); a file that is there must parse.
func readTokenizerConfig(dir string) (tokenizerConfig, error) {
	var c tokenizerConfig
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &c); err != nil {
			return c, fmt.Errorf("%s: %w", path, err)
		}
		c.found = true
	case !errors.Is(err, fs.ErrNotExist):
		return c, err
	}
	path = filepath.Join(dir, "special_tokens_map.json")
	data, err = os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return c, nil
	case err != nil:
		return c, err
	}
	var m tokenizerConfig
	if err := json.Unmarshal(data, &m); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	for _, f := range []struct{ dst, src *json.RawMessage }{
		{&c.UnkToken, &m.UnkToken}, {&c.ClsToken, &m.ClsToken}, {&c.SepToken, &m.SepToken},
		{&c.PadToken, &m.PadToken}, {&c.MaskToken, &m.MaskToken},
	} {
		if len(*f.src) > 0 {
			*f.dst = *f.src
		}
	}
	return c, nil
}

// tokenName reads a special token given as a string or as an AddedToken object.
func tokenName(raw json.RawMessage, def string) string {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	var obj struct{ Content string }
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content
	}
	return def
}

type tokenizerJSON struct {
	AddedTokens []struct {
		ID         *int32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		Normalized *bool  `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer *struct {
		Type               string `json:"type"`
		CleanText          *bool  `json:"clean_text"`
		HandleChineseChars *bool  `json:"handle_chinese_chars"`
		StripAccents       *bool  `json:"strip_accents"`
		Lowercase          *bool  `json:"lowercase"`
	} `json:"normalizer"`
	PreTokenizer *struct {
		Type string `json:"type"`
	} `json:"pre_tokenizer"`
	PostProcessor *struct {
		Type   string            `json:"type"`
		Single []json.RawMessage `json:"single"`
		// TemplateProcessing's special tokens by name.
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
		// BertProcessing's ["[SEP]", 102] and ["[CLS]", 101].
		Sep []json.RawMessage `json:"sep"`
		Cls []json.RawMessage `json:"cls"`
	} `json:"post_processor"`
	Padding *struct {
		PadID *int32 `json:"pad_id"`
	} `json:"padding"`
	Model struct {
		Type                    string           `json:"type"`
		Vocab                   map[string]int32 `json:"vocab"`
		UnkToken                *string          `json:"unk_token"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		MaxInputCharsPerWord    *int             `json:"max_input_chars_per_word"`
	} `json:"model"`
}

func tokOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func parseTokenizerJSON(data []byte, cfg tokenizerConfig) (*Tokenizer, error) {
	var j tokenizerJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, err
	}
	if j.Model.Type != "WordPiece" {
		return nil, fmt.Errorf("model.type %q: only WordPiece (BERT) is supported", j.Model.Type)
	}
	if len(j.Model.Vocab) == 0 {
		return nil, errors.New("model.vocab: empty")
	}
	if j.Normalizer == nil {
		return nil, errors.New("normalizer.type: missing; only BertNormalizer is supported")
	}
	if j.Normalizer.Type != "BertNormalizer" {
		return nil, fmt.Errorf("normalizer.type %q: only BertNormalizer is supported", j.Normalizer.Type)
	}
	if j.PreTokenizer == nil {
		return nil, errors.New("pre_tokenizer.type: missing; only BertPreTokenizer is supported")
	}
	if j.PreTokenizer.Type != "BertPreTokenizer" {
		return nil, fmt.Errorf("pre_tokenizer.type %q: only BertPreTokenizer is supported", j.PreTokenizer.Type)
	}
	lowercase := tokOr(j.Normalizer.Lowercase, true)
	t := &Tokenizer{
		cleanText:    tokOr(j.Normalizer.CleanText, true),
		chinese:      tokOr(j.Normalizer.HandleChineseChars, true),
		lowercase:    lowercase,
		stripAccents: tokOr(j.Normalizer.StripAccents, lowercase), // null follows lowercase
		maxChars:     tokOr(j.Model.MaxInputCharsPerWord, 100),
	}
	if t.maxChars < 0 {
		return nil, fmt.Errorf("model.max_input_chars_per_word %d: negative", t.maxChars)
	}
	unkName := tokOr(j.Model.UnkToken, "[UNK]")
	if err := t.setVocab(j.Model.Vocab, tokOr(j.Model.ContinuingSubwordPrefix, "##"), unkName); err != nil {
		return nil, fmt.Errorf("model.%w", err)
	}

	// Added tokens: ids as given; the normalized ones matched by their normalized form.
	var raw, normalized []addedToken
	byName := map[string]int32{}
	for i, a := range j.AddedTokens {
		if a.ID == nil || *a.ID < 0 {
			return nil, fmt.Errorf("added_tokens[%d].id: missing or negative", i)
		}
		id := *a.ID
		if v, ok := j.Model.Vocab[a.Content]; ok {
			id = v // as the Rust library assigns it, whatever the file says
		}
		byName[a.Content] = id
		t.vocabSize = max(t.vocabSize, int(id)+1)
		tok := addedToken{content: a.Content, id: id, singleWord: a.SingleWord}
		if tokOr(a.Normalized, !a.Special) {
			var s tokScratch
			tok.content = string(t.normalize(a.Content, &s))
			normalized = append(normalized, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.raw, t.normalized = newAddedTokens(raw), newAddedTokens(normalized)
	lookup := func(name string) int32 {
		if id, ok := byName[name]; ok {
			return id
		}
		if id, ok := j.Model.Vocab[name]; ok {
			return id
		}
		return -1
	}

	pp := j.PostProcessor
	switch {
	case pp == nil:
		return nil, errors.New("post_processor: missing; a BERT tokenizer adds [CLS] and [SEP]")
	case pp.Type == "BertProcessing":
		sep, err1 := pairID(pp.Sep)
		cls, err2 := pairID(pp.Cls)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("post_processor (BertProcessing): %w", err)
		}
		for _, f := range []struct {
			name string
			id   int32
		}{{"sep", sep}, {"cls", cls}} {
			if err := t.checkID(f.id); err != nil {
				return nil, fmt.Errorf("post_processor.%s (BertProcessing): %w", f.name, err)
			}
		}
		t.prefix, t.suffix = []int32{cls}, []int32{sep}
	case pp.Type == "TemplateProcessing":
		var used []string // the special tokens the template puts around the text
		if err := t.setTemplate(pp.Single, func(name string) ([]int32, bool) {
			st, ok := pp.SpecialTokens[name]
			used = append(used, name)
			return st.IDs, ok && len(st.IDs) > 0
		}); err != nil {
			return nil, fmt.Errorf("post_processor.single: %w", err)
		}
		for _, name := range used {
			for _, id := range pp.SpecialTokens[name].IDs {
				if err := t.checkID(id); err != nil {
					return nil, fmt.Errorf("post_processor.special_tokens[%q].ids: %w", name, err)
				}
			}
		}
	default:
		return nil, fmt.Errorf("post_processor.type %q: only TemplateProcessing and BertProcessing are supported", pp.Type)
	}

	t.specials = Specials{
		CLS:  lookup(tokenName(cfg.ClsToken, "[CLS]")),
		SEP:  lookup(tokenName(cfg.SepToken, "[SEP]")),
		PAD:  lookup(tokenName(cfg.PadToken, "[PAD]")),
		UNK:  t.unk,
		MASK: lookup(tokenName(cfg.MaskToken, "[MASK]")),
	}
	if j.Padding != nil && j.Padding.PadID != nil {
		if err := t.checkID(*j.Padding.PadID); err != nil {
			return nil, fmt.Errorf("padding.pad_id: %w", err)
		}
		t.specials.PAD = *j.Padding.PadID
	}
	return t, nil
}

// checkID refuses an id the file gives outside the vocabulary and added
// tokens: Encode would put it in every item, and the model refuses every
// item that holds one, so such a file is refused at load instead.
func (t *Tokenizer) checkID(id int32) error {
	if id < 0 || int(id) >= t.vocabSize {
		return fmt.Errorf("id %d is outside the vocabulary [0, %d)", id, t.vocabSize)
	}
	return nil
}

// pairID reads BertProcessing's ["[SEP]", 102].
func pairID(p []json.RawMessage) (int32, error) {
	var id int32
	if len(p) != 2 || json.Unmarshal(p[1], &id) != nil {
		return 0, errors.New(`want ["token", id] for sep and cls`)
	}
	return id, nil
}

// setTemplate takes the single-sequence template: special tokens, the sequence
// "A" once, special tokens.
func (t *Tokenizer) setTemplate(single []json.RawMessage, special func(string) ([]int32, bool)) error {
	seen := false
	for i, raw := range single {
		var piece struct {
			SpecialToken *struct {
				ID string `json:"id"`
			}
			Sequence *struct {
				ID string `json:"id"`
			}
		}
		if err := json.Unmarshal(raw, &piece); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		switch {
		case piece.Sequence != nil:
			if piece.Sequence.ID != "A" || seen {
				return fmt.Errorf("[%d]: want the sequence A once", i)
			}
			seen = true
		case piece.SpecialToken != nil:
			ids, ok := special(piece.SpecialToken.ID)
			if !ok {
				return fmt.Errorf("[%d]: special token %q not in special_tokens", i, piece.SpecialToken.ID)
			}
			if seen {
				t.suffix = append(t.suffix, ids...)
			} else {
				t.prefix = append(t.prefix, ids...)
			}
		default:
			return fmt.Errorf("[%d]: neither SpecialToken nor Sequence", i)
		}
	}
	if !seen {
		return errors.New("no sequence A")
	}
	return nil
}

// setVocab builds the lookup tables from the WordPiece vocabulary; errors name the
// field below model.
func (t *Tokenizer) setVocab(vocab map[string]int32, prefix, unkName string) error {
	if prefix == "" {
		return errors.New("continuing_subword_prefix: empty")
	}
	unk, ok := vocab[unkName]
	if !ok {
		return fmt.Errorf("unk_token %q: not in the vocabulary", unkName)
	}
	t.unk = unk
	cont := make(map[string]int32, len(vocab)/4)
	for piece, id := range vocab {
		if id < 0 {
			return fmt.Errorf("vocab[%q]: negative id %d", piece, id)
		}
		t.vocabSize = max(t.vocabSize, int(id)+1)
		if rest, ok := strings.CutPrefix(piece, prefix); ok && rest != "" {
			cont[rest] = id
		}
	}
	t.vocab, t.cont = newPieceTrie(vocab), newPieceTrie(cont)
	return nil
}

// loadVocabTxt loads vocab.txt (one piece a line, ids in line order) with the options
// of tokenizer_config.json, as transformers' BertTokenizer reads them; the special
// tokens are matched in the text as written, and wrap it as [CLS] … [SEP].
func loadVocabTxt(dir string, cfg tokenizerConfig) (*Tokenizer, error) {
	vocabPath := filepath.Join(dir, "vocab.txt")
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	f, err := os.Open(vocabPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoTokenizer)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if !cfg.found {
		return nil, fmt.Errorf("%s: %w (vocab.txt alone does not say whether to lower-case)", dir, ErrNoTokenizer)
	}
	if _, err := os.Stat(filepath.Join(dir, "added_tokens.json")); err == nil {
		return nil, fmt.Errorf("%s: added tokens beside vocab.txt are not supported; use tokenizer.json", filepath.Join(dir, "added_tokens.json"))
	}
	switch cfg.TokenizerClass {
	case "", "BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast":
	default:
		return nil, fmt.Errorf("%s: tokenizer_class %q: only BERT WordPiece tokenizers are supported", cfgPath, cfg.TokenizerClass)
	}
	if !tokOr(cfg.DoBasicTokenize, true) {
		return nil, fmt.Errorf("%s: do_basic_tokenize false is not supported", cfgPath)
	}
	if len(cfg.NeverSplit) > 0 {
		return nil, fmt.Errorf("%s: never_split is not supported", cfgPath)
	}
	vocab := map[string]int32{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for id := int32(0); sc.Scan(); id++ {
		vocab[string(bytes.TrimSuffix(sc.Bytes(), []byte("\r")))] = id
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", vocabPath, err)
	}
	if len(vocab) == 0 {
		return nil, fmt.Errorf("%s: empty", vocabPath)
	}

	lowercase := tokOr(cfg.DoLowerCase, true)
	t := &Tokenizer{
		cleanText:    true,
		chinese:      tokOr(cfg.TokenizeChineseChars, true),
		lowercase:    lowercase,
		stripAccents: tokOr(cfg.StripAccents, lowercase),
		maxChars:     100,
	}
	names := [...]string{
		tokenName(cfg.UnkToken, "[UNK]"), tokenName(cfg.ClsToken, "[CLS]"), tokenName(cfg.SepToken, "[SEP]"),
		tokenName(cfg.PadToken, "[PAD]"), tokenName(cfg.MaskToken, "[MASK]"),
	}
	if err := t.setVocab(vocab, "##", names[0]); err != nil {
		return nil, fmt.Errorf("%s: %w", vocabPath, err)
	}
	ids := [len(names)]int32{}
	var raw []addedToken
	for i, name := range names {
		id, ok := vocab[name]
		if !ok {
			if i == 3 || i == 4 { // a model may have no [PAD] or [MASK]
				ids[i] = -1
				continue
			}
			return nil, fmt.Errorf("%s: special token %q (%s): not in the vocabulary", vocabPath, name, cfgPath)
		}
		ids[i] = id
		raw = append(raw, addedToken{content: name, id: id})
	}
	t.raw = newAddedTokens(raw)
	t.prefix, t.suffix = []int32{ids[1]}, []int32{ids[2]}
	t.specials = Specials{UNK: ids[0], CLS: ids[1], SEP: ids[2], PAD: ids[3], MASK: ids[4]}
	return t, nil
}
