package fakeoai

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
)

// CountTokens is the double's tokenizer: one token per whitespace-separated
// word. Outputs are made of one-token words, so CountTokens of an answer's
// text is its completion tokens.
func CountTokens(s string) int { return len(strings.Fields(s)) }

// Message is one chat message as the tokenizer sees it.
type Message struct{ Role, Name, Content string }

// ChatPromptTokens is a chat request's prompt_tokens, counted as OpenAI's
// cookbook counts them (How_to_count_tokens_with_tiktoken): 3 per message,
// the tokens of its role and content, those of its name plus 1, and 3
// priming the reply.
func ChatPromptTokens(msgs []Message) int {
	n := 3
	for _, m := range msgs {
		n += 3 + CountTokens(m.Role) + CountTokens(m.Content)
		if m.Name != "" {
			n += CountTokens(m.Name) + 1
		}
	}
	return n
}

var lenDirective = regexp.MustCompile(`\[\[len=(\d{1,7})\]\]`)

// DefaultOutputTokens is the natural length of choice of a completion of
// prompt: N where the prompt holds "[[len=N]]" (N at least 1), otherwise
// between 8 and 64 from a hash of the prompt and the choice.
func DefaultOutputTokens(prompt string, choice int) int {
	if m := lenDirective.FindStringSubmatch(prompt); m != nil {
		n, _ := strconv.Atoi(m[1])
		return max(n, 1)
	}
	return 8 + int(hash(prompt, uint64(choice))%57)
}

// words are one token each, so that an answer's text counts as its usage.
var words = [...]string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
	"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"}

// outputText is the deterministic text of choice for prompt, n tokens long.
func outputText(prompt string, choice, n int) string {
	r := rand.New(rand.NewPCG(hash(prompt, uint64(choice)), 0x6f7574707574))
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// Embed is the embedding the double answers for input: dim values drawn
// from a hash of the text, scaled to unit length. A token-array input is
// embedded as its decimal numbers joined by spaces.
func Embed(input string, dim int) []float64 {
	r := rand.New(rand.NewPCG(hash(input, 0), 0x656d626564))
	v := make([]float64, dim)
	var norm float64
	for i := range v {
		v[i] = r.Float64()*2 - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		// float32 precision, so that base64 (float32) and float answers agree.
		v[i] = float64(float32(v[i] / norm))
	}
	return v
}

func hash(s string, salt uint64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], salt)
	h.Write(b[:])
	h.Write([]byte(s))
	return h.Sum64()
}
