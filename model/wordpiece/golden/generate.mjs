// Writes the tokenizer golden files of model/wordpiece (run by `make golden-tokenizer`):
//
//   testdata/tokenizer/texts.json   the input texts, generated here deterministically
//   testdata/tokenizer/golden.json  for each text, the ids of two tokenizers nobody in this
//                                   project wrote, loaded from the committed tokenizer.json:
//     js:    @huggingface/transformers (pure JavaScript), remote loading disabled;
//     rust:  the Node binding of Hugging Face's Rust `tokenizers` (the library behind
//            Python's fast tokenizers, so what sentence-transformers feeds a model);
//     trunc: the Rust library's output truncated to several max lengths (LongestFirst),
//            because transformers.js truncation cuts the array and loses the final [SEP];
//   and `variants`: the same tokenizer with other added-token flags (lstrip, rstrip,
//   single_word, normalized, non-special added tokens), with Rust's ids for each.
//
// Nothing here talks to the network: both libraries read the local files.

import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { AutoTokenizer, env } from '@huggingface/transformers';

const require = createRequire(import.meta.url);
const rust = require('tokenizers');

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.resolve(here, '../testdata');
const tokDir = path.join(testdata, 'tokenizer');

// ---- deterministic texts ----------------------------------------------------

// mulberry32: a small seeded PRNG, so the texts are the same on every run.
function prng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rnd = prng(17);
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cp = (...xs) => String.fromCodePoint(...xs);

const handWritten = [
  '', ' ', '   ', '\t\n\r ', '\u00a0\u2003\u3000', '\u200b', '\u200b\u200c\u200d\u2060\ufeff',
  'Hello, World!', 'hello world', 'HELLO WORLD', 'The quick brown fox jumps over the lazy dog.',
  'unaffable', 'unbelievably tokenization-friendly', "don't won't can't y'all", 'e-mail@example.com',
  'https://example.com/path?q=1&r=two#frag', 'C++ / C# / F# / .NET', 'rock\'n\'roll', 'o\'clock',
  // accents, precomposed and combining
  'café naïve résumé coöperate façade', 'CAFÉ NAÏVE RÉSUMÉ', 'cafe\u0301 nai\u0308ve', 'Ångström Øre Æsir Œuvre ß ẞ',
  'Crème brûlée à la mode', 'Düsseldorf Zürich München Köln', 'São Paulo, Açores, Coração',
  'İstanbul ıi İI', 'ǅ ǈ ǋ Ǳ', 'ﬁ ﬂ ﬀ', 'a\u0300\u0301\u0302\u0303\u0304b', '\u0301\u0302 leading marks',
  'x\u20dd \u20e3 enclosing', 'Z\u0351\u0358\u0360a\u035cl\u0361g\u0489o', 'ñ Ñ n\u0303 N\u0303',
  // Greek, Cyrillic, Arabic, Hebrew, Devanagari, Thai, Korean, Japanese, Chinese
  'ΣΑΣ σας ΟΔΟΣ Ὀδυσσεύς', 'Ελληνικά: άέήίόύώ ΐΰ', 'Привет, мир! Ёжик ЁЛКА', 'Україна ґанок Їжак',
  'مرحبا بالعالم', 'العربيةُ لغةٌ', 'שָׁלוֹם עולם', 'नमस्ते दुनिया', 'हिन्दी भाषा क्षत्रिय',
  'สวัสดีชาวโลก', 'ภาษาไทย ๑๒๓', '안녕하세요 세계', '한국어 텍스트', 'こんにちは世界', 'カタカナ ひらがな 漢字',
  '中文字符测试', '我爱北京天安门。', '繁體中文，標點！', '\uf900\uf901\ufa0e', cp(0x20000, 0x20001, 0x2a6d6),
  cp(0x2f800) + '兀', '日本語とEnglishのmix', 'Emoji 😀😃😄 and 👍🏽 and 👨‍👩‍👧‍👦',
  '🇫🇷🇩🇪 flags', '❤️ ☺️ ✔️', '★☆✓✗→←↑↓∞≈≠≤≥', '€100 £50 ¥1000 ₹20 $5', '©®™ ℃ ℉ № ℗',
  '½ ¼ ¾ ² ³ ¹', '①②③ ⅠⅡⅢ', 'ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３', '，。！？：；', '«quotes» „German“ “curly” ‘single’',
  '—dash–en-dash‐hyphen', '…ellipsis…', '¿Qué? ¡Sí!', '§ ¶ † ‡ • ‰',
  // numbers and punctuation
  '1234567890', '3.14159 2,718 1e10 -42 +7', '2024-06-30T12:34:56Z', '0x1F 0b1010 007',
  '!!!???...', '((([[[{{{}}}]]])))', '@#$%^&*_+=|\\/<>~`', '"quoted" \'single\'', '---___===',
  'a.b.c.d', 'U.S.A. e.g. i.e.', '#hashtag @mention', ':) :( ;) :D <3',
  // special-token literals
  '[CLS]', '[SEP]', '[MASK]', '[UNK]', '[PAD]', '[CLS] hello [SEP]', 'The capital of France is [MASK].',
  '[mask] [Mask] [MASK ] [ MASK]', 'x[MASK]y', '[MASK][MASK][MASK]', '[[MASK]]', '[UNK][unk]', '[CLS' ,
  'SEP] [SEP', '[MASK]s and [MASK]ed', ' [PAD] [PAD] ', '[CLS][SEP][PAD][UNK][MASK]', '##ing ##s',
  // long words (max_input_chars_per_word is 100)
  'a'.repeat(99), 'a'.repeat(100), 'a'.repeat(101), 'word ' + 'x'.repeat(150) + ' word',
  'é'.repeat(100), 'é'.repeat(101), 'e\u0301'.repeat(60), 'ab'.repeat(50) + 'c',
  'supercalifragilisticexpialidocious', 'pneumonoultramicroscopicsilicovolcanoconiosis',
  'antidisestablishmentarianism'.repeat(4), '😀'.repeat(101), '😀'.repeat(50),
  // control, zero-width and odd code points
  'a\u0000b', 'a\u0001b\u0007c\u001bd', 'tab\there', 'line\nbreak\r\nwindows', 'a\u000bb\u000cc',
  'a\u0085b', 'a\u007fb', 'a\u00adb soft\u00adhyphen', 'zero\u200bwidth\u200cjoin\u200dword',
  'bom\ufeffin', 'a\u2028b\u2029c', 'rtl \u202eevil\u202c text', 'a\ufffdb', '\ufffd\ufffd',
  'a\ufffeb\uffffc', 'private\ue000use\uf8ff', 'a' + cp(0xf0000) + 'b', 'tag' + cp(0xe0041, 0xe007f),
  'unassigned\u0378\u0379', 'a' + cp(0x10ffff) + 'b', 'noncharacter\ufdd0', 'vs\ufe0f\ufe0e',
  'mongolian\u180evs', 'hair\u200aspace thin\u2009space', 'ideographic\u3000space',
  // mixed and long text
  'Mixed: English, Français, Deutsch, Español, Русский, العربية, हिन्दी, ไทย, 한국어, 中文, 日本語.',
];

const pools = {
  ascii: 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789',
  punct: '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»“”‘’—–…·•、。，！？',
  space: [' ', ' ', ' ', '\t', '\n', '\u00a0', '\u2003', '\u3000'],
  accent: 'àáâãäåèéêëìíîïòóôõöùúûüýÿçñÀÁÂÃÄÅÈÉÊËÌÍÎÏÒÓÔÕÖÙÚÛÜÝÇÑœŒæÆøØßłŁšŠžŽčČřŘőŐűŰ',
  combining: ['\u0300', '\u0301', '\u0302', '\u0303', '\u0308', '\u030a', '\u0327', '\u0328', '\u0331', '\u20dd'],
  greek: 'αβγδεζηθικλμνξοπρστυφχψωςΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώ',
  cyrillic: 'абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯіїєґ',
  arabic: 'ابتثجحخدذرزسشصضطظعغفقكلمنهوي ًٌٍَُِّْ',
  devanagari: 'अआइईउऊएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौंः्',
  thai: 'กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮะัาำิีึืุูเแโใไ่้๊๋',
  hangul: '가나다라마바사아자차카타파하한국어글말씨앗',
  cjk: '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明',
  emoji: ['😀', '😂', '🥲', '👍', '👍🏿', '🔥', '🚀', '❤️', '🇯🇵', '👩‍💻', '🧑🏽‍🚀', '✨', '🙏'],
  control: ['\u0000', '\u0001', '\u0008', '\u000b', '\u000c', '\u001f', '\u007f', '\u0085', '\u009f', '\u00ad', '\u200b', '\u200c', '\u200d', '\u2060', '\ufeff', '\ufffd', '\ue000', '\u0378'],
  special: ['[CLS]', '[SEP]', '[MASK]', '[UNK]', '[PAD]', '[mask]', '[Mask]', '[MASK', 'MASK]'],
};
const charsOf = (s) => (typeof s === 'string' ? Array.from(s) : s);
const words = (pool, n, maxLen) => {
  const cs = charsOf(pools[pool]);
  const out = [];
  for (let i = 0; i < n; i++) {
    let w = '';
    const len = 1 + Math.floor(rnd() * maxLen);
    for (let j = 0; j < len; j++) w += pick(cs);
    out.push(w);
  }
  return out;
};

const english = ('the of and to in a is that for it as was with be by on not he this are or his from at ' +
  'which but have an they you were her she there had one all we can their has been if more when will ' +
  'would who so no queue message memory batch model token encoder attention inference throughput latency ' +
  'embedding sentence transformer visibility timeout subscriber publisher budget admission').split(' ');

const generated = [];
// Sentences of real words with random case, punctuation and spacing.
for (let i = 0; i < 80; i++) {
  const n = 3 + Math.floor(rnd() * 25);
  let s = '';
  for (let j = 0; j < n; j++) {
    let w = pick(english);
    const r = rnd();
    if (r < 0.15) w = w.toUpperCase();
    else if (r < 0.3) w = w[0].toUpperCase() + w.slice(1);
    s += w;
    if (rnd() < 0.15) s += pick(charsOf(pools.punct));
    s += rnd() < 0.9 ? ' ' : pick(pools.space);
  }
  generated.push(s);
}
// One script (or class of characters) per text.
const scripts = ['ascii', 'accent', 'greek', 'cyrillic', 'arabic', 'devanagari', 'thai', 'hangul', 'cjk', 'punct'];
for (const script of scripts) {
  for (let i = 0; i < 8; i++) generated.push(words(script, 1 + Math.floor(rnd() * 10), 12).join(pick(pools.space)));
}
// Mixtures of everything, including control characters, emoji, combining marks and special tokens.
const all = ['ascii', 'accent', 'greek', 'cyrillic', 'arabic', 'devanagari', 'thai', 'hangul', 'cjk', 'punct', 'emoji', 'control', 'combining', 'special', 'space'];
for (let i = 0; i < 120; i++) {
  let s = '';
  const n = 1 + Math.floor(rnd() * 30);
  for (let j = 0; j < n; j++) {
    const pool = pick(all);
    if (pool === 'emoji' || pool === 'control' || pool === 'combining' || pool === 'special' || pool === 'space') {
      s += pick(pools[pool]);
    } else {
      s += words(pool, 1, 8)[0];
    }
    if (rnd() < 0.5) s += ' ';
  }
  generated.push(s);
}
// Long texts, several hundred tokens, for truncation.
for (let i = 0; i < 12; i++) {
  const n = 100 + Math.floor(rnd() * 500);
  const ws = [];
  for (let j = 0; j < n; j++) ws.push(rnd() < 0.8 ? pick(english) : words(pick(scripts), 1, 10)[0]);
  generated.push(ws.join(' '));
}
// Words around the 100-character limit, in 1-, 2- and 4-byte characters.
for (const ch of ['z', 'ü', '中', '😀', 'a\u0301', 'д', 'ß']) {
  for (const n of [98, 99, 100, 101, 102]) generated.push(ch.repeat(n));
}

// CJK range edges, and characters where Unicode versions disagree (the Rust library
// classifies punctuation, controls and marks with Unicode 8.0 tables).
for (const c of [0x33ff, 0x3400, 0x4dbf, 0x4dc0, 0x4dff, 0x4e00, 0x9fff, 0xa000, 0xf8ff, 0xf900, 0xfaff, 0xfb00,
  0x1ffff, 0x20000, 0x2a6df, 0x2a6e0, 0x2a6ff, 0x2a700, 0x2b73f, 0x2b740, 0x2b81f, 0x2b820, 0x2b91f, 0x2b920,
  0x2ceaf, 0x2ceb0, 0x2f7ff, 0x2f800, 0x2fa1f, 0x2fa20, 0x30000]) {
  generated.push('x' + cp(c, c) + 'y ' + cp(c));
}
generated.push('a\u2e43b a\u061db a\u0890b \u2126 \u212a \u212b ǅ Ǆ ǆ', 'new\u{11f43}punct and\u{13438}format');

// The sweep: every non-ASCII character the normalizer or the pre-tokenizer treats
// specially (punctuation, controls, formats, marks, whitespace, characters with a
// canonical decomposition or a case mapping), each as a word "a<c>b", 64 words a text.
// Private-use planes and Hangul syllables are sampled.
// Blocks of thousands of letters of one kind (ideographs, syllables, hieroglyphs),
// left out of the sweep of letters: CJK is tested above, and nothing in them changes
// class between Unicode versions.
const bigBlock = (c) => (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x4e00 && c <= 0x9fff) || (c >= 0xa000 && c <= 0xa4cf) ||
  (c >= 0xac00 && c <= 0xd7a3) || (c >= 0x1100 && c <= 0x11ff) || (c >= 0x13000 && c <= 0x1345f) ||
  (c >= 0x12000 && c <= 0x1254f) || (c >= 0x16800 && c <= 0x16a3f) || (c >= 0x17000 && c <= 0x18cff) ||
  (c >= 0x1b000 && c <= 0x1b2ff) || (c >= 0x1d000 && c <= 0x1d24f) || (c >= 0x1d400 && c <= 0x1d7ff) ||
  (c >= 0x1f000 && c <= 0x1faff) || c >= 0x20000 || (c >= 0x1400 && c <= 0x167f) || (c >= 0x2800 && c <= 0x28ff) ||
  (c >= 0xf900 && c <= 0xfaff) || (c >= 0x10600 && c <= 0x1077f) || (c >= 0x14400 && c <= 0x1467f);
const sweepChars = [];
for (let c = 0x80; c <= 0x10ffff; c++) {
  if (c >= 0xd800 && c <= 0xdfff) continue;
  const ch = cp(c);
  const privateUse = (c >= 0xe000 && c <= 0xf8ff) || c >= 0xf0000;
  const hangul = c >= 0xac00 && c <= 0xd7a3;
  if ((privateUse || hangul) && c % 97 !== 0) continue;
  if (/[\p{P}\p{C}\p{M}\p{Z}\s]/u.test(ch) && !/\p{Cn}/u.test(ch) ||
    ch.normalize('NFD') !== ch || ch.toLowerCase() !== ch || ch.toUpperCase() !== ch) {
    sweepChars.push(ch);
  } else if (/[\p{L}\p{N}\p{S}]/u.test(ch) && !bigBlock(c)) {
    // Letters, numbers and symbols too: a character that was punctuation, a mark or
    // a control in Unicode 8.0 (the Rust library's tables) may be a letter now.
    sweepChars.push(ch);
  }
}
const sweep = [];
for (let i = 0; i < sweepChars.length; i += 64) {
  sweep.push(sweepChars.slice(i, i + 64).map((ch) => 'a' + ch + 'b').join(' '));
}

const texts = [...handWritten, ...generated, ...sweep];

// ---- tokenize with both libraries ----------------------------------------------

env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = testdata + path.sep;
const js = await AutoTokenizer.from_pretrained('tokenizer');
const jsIds = (t) => Array.from(js(t, { add_special_tokens: true }).input_ids.data, Number);

async function rustTokenizer(file) {
  const tok = rust.Tokenizer.fromFile(file);
  tok.disablePadding();
  tok.disableTruncation();
  return tok;
}
const rustIds = async (tok, t) => Array.from(await tok.encode(t));

const maxLens = [2, 3, 4, 8, 16, 64, 128, 256, 512];
const rs = await rustTokenizer(path.join(tokDir, 'tokenizer.json'));
const rsTrunc = await rustTokenizer(path.join(tokDir, 'tokenizer.json'));
const cases = [];
let differ = 0;
for (const t of texts) {
  // js only where it differs from rust, to keep the file small.
  const c = { rust: Array.from((await rs.encode(t)).getIds()) };
  const j = jsIds(t);
  if (JSON.stringify(j) !== JSON.stringify(c.rust)) {
    differ++;
    c.js = j;
  }
  if (cases.length < handWritten.length + generated.length && c.rust.length > 4) {
    c.trunc = {};
    for (const m of maxLens) {
      if (m >= c.rust.length) continue;
      rsTrunc.setTruncation(m, { strategy: 'LongestFirst' });
      c.trunc[m] = Array.from((await rsTrunc.encode(t)).getIds());
    }
  }
  cases.push(c);
}

// ---- added-token variants (Rust only: transformers.js ignores single_word) ----------

const base = JSON.parse(readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8'));
const tok = (id, content, flags) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...flags,
});
const baseAdded = base.added_tokens.filter((t) => t.content !== '[MASK]');
const variants = [
  { name: 'mask-lstrip-rstrip', added_tokens: [...baseAdded, tok(103, '[MASK]', { lstrip: true, rstrip: true })] },
  { name: 'mask-lstrip', added_tokens: [...baseAdded, tok(103, '[MASK]', { lstrip: true })] },
  { name: 'mask-single-word', added_tokens: [...baseAdded, tok(103, '[MASK]', { single_word: true })] },
  { name: 'mask-normalized', added_tokens: [...baseAdded, tok(103, '[MASK]', { normalized: true })] },
  {
    name: 'non-special-added',
    added_tokens: [...base.added_tokens,
      tok(30522, 'VramQ', { special: false, normalized: true }),
      tok(30523, 'GPU-Queue', { special: false, normalized: false, single_word: true }),
      tok(7592, 'hello', { special: false, normalized: true, rstrip: true }), // already in the vocabulary
      tok(30524, 'Ωmega', { special: false, normalized: false, lstrip: true }),
      // In the vocabulary under another id: the Rust library takes the vocabulary's.
      tok(30525, 'world', { special: false, normalized: true })],
  },
];
const variantTexts = [
  'The capital of France is [MASK].', 'a [MASK] b', 'a  [MASK]  b', 'a\t[MASK]\nb', 'x[MASK]y', '[MASK]',
  ' [MASK] ', '[MASK][MASK]', 'a [MASK] [MASK] b', 'word[MASK] [MASK]word', '_[MASK]_', 'é[MASK]é',
  '1[MASK]2', '[mask] [Mask] [MASK]', '[CLS] [MASK] [SEP]', '\u3000[MASK]\u3000', '中[MASK]中', '.[MASK].',
  'vramq VramQ VRAMQ vramqs xvramq', 'GPU-Queue gpu-queue xGPU-Queue GPU-Queuey (GPU-Queue)', 'hello   world hello',
  'HELLO  World', 'a   Ωmega ωmega Ωmegas', 'say hello[MASK]  Ωmega', 'ab hello [MASK] Ωmega GPU-Queue',
];
const dir = mkdtempSync(path.join(tmpdir(), 'vramq-golden-'));
const variantOut = [];
try {
  for (const v of variants) {
    const file = path.join(dir, v.name + '.json');
    writeFileSync(file, JSON.stringify({ ...base, added_tokens: v.added_tokens }));
    const vt = await rustTokenizer(file);
    const ids = [];
    for (const t of variantTexts) ids.push(Array.from((await vt.encode(t)).getIds()));
    variantOut.push({ name: v.name, added_tokens: v.added_tokens, ids });
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

// ---- normalizer variants (other BertNormalizer options), on the hand-written texts ----

const normalizerVariants = [
  { name: 'cased', normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: false } },
  { name: 'lowercase-keep-accents', normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: false, lowercase: true } },
  { name: 'cased-strip-accents', normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: true, lowercase: false } },
  { name: 'no-chinese-no-clean', normalizer: { type: 'BertNormalizer', clean_text: false, handle_chinese_chars: false, strip_accents: null, lowercase: true } },
];
const normalizerOut = [];
const dir2 = mkdtempSync(path.join(tmpdir(), 'vramq-golden-'));
try {
  for (const v of normalizerVariants) {
    const file = path.join(dir2, v.name + '.json');
    writeFileSync(file, JSON.stringify({ ...base, normalizer: v.normalizer }));
    const vt = await rustTokenizer(file);
    const ids = [];
    for (const t of handWritten) ids.push(Array.from((await vt.encode(t)).getIds()));
    normalizerOut.push({ name: v.name, normalizer: v.normalizer, ids });
  }
} finally {
  rmSync(dir2, { recursive: true, force: true });
}

const pkg = (name) => JSON.parse(readFileSync(path.join(here, 'node_modules', name, 'package.json'), 'utf8')).version;
writeFileSync(path.join(tokDir, 'texts.json'), JSON.stringify(texts, null, 0).replace(/","/g, '",\n"') + '\n');
writeFileSync(path.join(tokDir, 'golden.json'), JSON.stringify({
  generator: 'model/wordpiece/golden/generate.mjs',
  js: '@huggingface/transformers ' + pkg('@huggingface/transformers'),
  rust: 'tokenizers (Node binding of the Rust library) ' + pkg('tokenizers'),
  sweep_from: handWritten.length + generated.length,
  cases,
  variant_texts: variantTexts,
  variants: variantOut,
  normalizer_variants: normalizerOut, // on texts[0:len(ids)]
}).replaceAll('},{"rust"', '},\n{"rust"').replaceAll('],[', '],\n[') + '\n'); // a case a line, for readable diffs
console.log(`${texts.length} texts (${sweep.length} of them the sweep of ${sweepChars.length} characters; ${differ} where transformers.js and the Rust library differ), ${variants.length} added-token variants, ${normalizerVariants.length} normalizer variants`);
