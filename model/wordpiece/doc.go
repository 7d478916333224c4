// Package wordpiece is the tokenizer of BERT-family models (WordPiece, with
// BERT's normalizer, pre-tokenizer, added tokens and special tokens), as
// Hugging Face's tokenizers library runs it. It stands apart from the model
// that runs the ids (model/bert) because a model server's backend
// (model/modelserver) counts tokens with it too, and needs no encoder for
// that.
//
// The ids are checked against Hugging Face's Rust tokenizers library and
// transformers.js on the committed all-MiniLM-L6-v2 tokenizer (see golden
// and testdata/tokenizer).
package wordpiece
