package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// The model the real engine serves: a small Llama-style decoder whose
// weights the server makes up (vLLM's --load-format dummy, or transformers'
// from_config), so that nothing comes from a hub. What it says is noise;
// what the benchmark needs from it is a real engine's scheduler, KV cache
// and metrics under load.

// vocabSize is the tokenizer's vocabulary and the model's: equal, so that
// every id the random weights pick decodes to a token.
const vocabSize = 1024

// specials come first, as BERT's do; bos and eos are [CLS] and [SEP].
var specials = []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}

const (
	bosID = 2
	eosID = 3
)

// words are whole-word pieces, so that the benchmark's English prompts are
// mostly one token a word, as with a real tokenizer.
var words = []string{
	"the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at", "by", "this",
	"be", "from", "or", "an", "are", "not", "have", "but", "what", "all", "were", "when", "we", "there", "can",
	"which", "their", "said", "if", "do", "will", "each", "about", "how", "up", "out", "them", "then", "she",
	"many", "some", "so", "these", "would", "other", "into", "has", "more", "her", "two", "like", "him", "see",
	"time", "could", "no", "make", "than", "first", "been", "its", "who", "now", "people", "my", "made", "over",
	"did", "down", "only", "way", "find", "use", "may", "water", "long", "little", "very", "after", "words",
	"called", "just", "where", "most", "know", "get", "through", "back", "much", "before", "go", "good", "new",
	"write", "our", "used", "me", "man", "too", "any", "day", "same", "right", "look", "think", "also", "around",
	"another", "came", "come", "work", "three", "word", "must", "because", "does", "part", "even", "place",
	"well", "such", "here", "take", "why", "things", "help", "put", "years", "different", "away", "again",
	"off", "went", "old", "number", "great", "tell", "men", "say", "small", "every", "found", "still", "between",
	"name", "should", "home", "big", "give", "air", "line", "set", "own", "under", "read", "last", "never", "us",
	"left", "end", "along", "while", "might", "next", "sound", "below", "saw", "something", "thought", "both",
	"few", "those", "always", "show", "large", "often", "together", "asked", "house", "world", "going", "want",
	"school", "important", "until", "form", "food", "keep", "children", "feet", "land", "side", "without",
	"boy", "once", "animals", "life", "enough", "took", "sometimes", "four", "head", "above", "kind", "began",
	"almost", "live", "page", "got", "earth", "need", "far", "hand", "high", "year", "mother", "light",
	"country", "father", "let", "night", "following", "picture", "being", "study", "second", "eyes", "soon",
	"times", "story", "boys", "since", "white", "days", "paper", "hard", "near", "sentence", "better", "best",
	"across", "during", "today", "others", "however", "sure", "means", "knew", "try", "told", "young", "miles",
	"sun", "ways", "thing", "whole", "hear", "example", "heard", "several", "change", "answer", "room", "sea",
	"against", "top", "turned", "learn", "point", "city", "play", "toward", "five", "using", "himself", "usually",
	"item", "prompt", "user", "assistant", "system", "batch", "queue", "model", "server", "token", "message",
}

// vocab is the tokenizer's vocabulary: the specials, every printable ASCII
// character alone and as a continuation, the words, then two-letter
// continuations up to vocabSize. Ids are positions.
func vocab() []string {
	v := append([]string(nil), specials...)
	var single, cont []string
	for c := byte('!'); c <= '~'; c++ {
		if c >= 'A' && c <= 'Z' {
			continue // the normalizer lowercases
		}
		single = append(single, string(c))
		cont = append(cont, "##"+string(c))
	}
	v = append(v, single...)
	v = append(v, cont...)
	v = append(v, words...)
	for a := byte('a'); a <= 'z' && len(v) < vocabSize; a++ {
		for b := byte('a'); b <= 'z' && len(v) < vocabSize; b++ {
			v = append(v, "##"+string([]byte{a, b}))
		}
	}
	return v
}

// llamaConfig is the model's config.json: Llama's fields as transformers'
// LlamaConfig names them. Eight layers of 1,024, grouped-query attention
// with 8 KV heads of 64: 2 × 8 × 8 × 64 × 2 bytes = 16 KiB of KV a token
// in bfloat16.
func llamaConfig() map[string]any {
	return map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"vocab_size":              vocabSize,
		"hidden_size":             1024,
		"intermediate_size":       2816,
		"num_hidden_layers":       8,
		"num_attention_heads":     16,
		"num_key_value_heads":     8,
		"head_dim":                64,
		"hidden_act":              "silu",
		"max_position_embeddings": 4096,
		"rms_norm_eps":            1e-5,
		"rope_theta":              10000.0,
		"tie_word_embeddings":     false,
		"bos_token_id":            bosID,
		"eos_token_id":            eosID,
		"pad_token_id":            0,
		"torch_dtype":             "bfloat16",
		"initializer_range":       0.02,
	}
}

// kvBytesPerToken is what llamaConfig's KV cache takes a token (TGI's
// formula, as model/modelserver computes it from config.json).
const kvBytesPerToken = 2 * 8 * 8 * 64 * 2

// chatTemplate renders a conversation as "role: content" lines; the model
// is noise, so the template needs only to be one the server can run.
const chatTemplate = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
	"{% if add_generation_prompt %}assistant:{% endif %}"

// tokenizerJSON is a Hugging Face tokenizers file for vocab, in the layout
// BERT's has (normalizer, pre-tokenizer, WordPiece model and decoder), with
// a post-processor that prepends [CLS] as the bos token and appends
// nothing: a decoder's prompt must not end in its eos.
func tokenizerJSON(v []string) map[string]any {
	ids := make(map[string]int, len(v))
	for i, p := range v {
		ids[p] = i
	}
	added := make([]map[string]any, len(specials))
	for i, s := range specials {
		added[i] = map[string]any{"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": true}
	}
	seq := func(id string, typ int) map[string]any {
		return map[string]any{"Sequence": map[string]any{"id": id, "type_id": typ}}
	}
	cls := map[string]any{"SpecialToken": map[string]any{"id": "[CLS]", "type_id": 0}}
	return map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer": map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
			"strip_accents": nil, "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{cls, seq("A", 0)},
			"pair":   []any{cls, seq("A", 0), seq("B", 1)},
			"special_tokens": map[string]any{
				"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{bosID}, "tokens": []string{"[CLS]"}},
			},
		},
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100, "vocab": ids},
	}
}

// tokenizerConfig is tokenizer_config.json: the fast tokenizer over
// tokenizer.json, its special tokens, and the chat template vLLM's and
// transformers' chat routes need.
func tokenizerConfig() map[string]any {
	return map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"bos_token":                    "[CLS]",
		"eos_token":                    "[SEP]",
		"unk_token":                    "[UNK]",
		"pad_token":                    "[PAD]",
		"mask_token":                   "[MASK]",
		"cls_token":                    "[CLS]",
		"sep_token":                    "[SEP]",
		"do_lower_case":                true,
		"model_max_length":             4096,
		"clean_up_tokenization_spaces": true,
		"chat_template":                chatTemplate,
	}
}

// writeModel writes config.json, generation_config.json, tokenizer.json
// and tokenizer_config.json into dir, creating it.
func writeModel(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]any{
		"config.json":            llamaConfig(),
		"generation_config.json": map[string]any{"bos_token_id": bosID, "eos_token_id": eosID, "do_sample": false},
		"tokenizer.json":         tokenizerJSON(vocab()),
		"tokenizer_config.json":  tokenizerConfig(),
	}
	for name, v := range files {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("the model's %s: %w", name, err)
		}
	}
	return nil
}
