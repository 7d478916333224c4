// Shared by gen.mjs and bench.mjs: generated BERT weights of a realistic
// scale, Hugging Face tensor names, the safetensors file, and the ONNX graph
// of BertModel (plus sentence-transformers pooling) from standard ops.

import onnxproto from 'onnx-proto';

const { onnx } = onnxproto;

// mulberry32: a small seeded generator, so that the files are reproducible.
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const normal = () => {
    // Box-Muller; 1 - u keeps log away from 0.
    const u = 1 - next();
    const v = next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo));
  return { next, normal, int };
}

// Weights at the scale trained encoders have, not 0.02 everywhere: linear
// layers N(0, 1/fan_in), biases and LayerNorm shifts N(0, 0.1²), LayerNorm
// scales 1 + N(0, 0.1²). With them an attention score is O(1), so a
// missing 1/sqrt(d) or a tanh GELU moves the outputs well past float32
// noise.
export function generateWeights(cfg, seed) {
  const r = rng(seed);
  const H = cfg.hidden_size;
  const I = cfg.intermediate_size;
  const t = {};
  const fill = (shape, f) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = f();
    return { shape, data: v };
  };
  const linear = (name, out, inn) => {
    const s = 1 / Math.sqrt(inn);
    t[`${name}.weight`] = fill([out, inn], () => r.normal() * s);
    t[`${name}.bias`] = fill([out], () => r.normal() * 0.1);
  };
  const ln = (name) => {
    t[`${name}.weight`] = fill([H], () => 1 + r.normal() * 0.1);
    t[`${name}.bias`] = fill([H], () => r.normal() * 0.1);
  };
  t['embeddings.word_embeddings.weight'] = fill([cfg.vocab_size, H], () => r.normal() * 0.5);
  t['embeddings.position_embeddings.weight'] = fill([cfg.max_position_embeddings, H], () => r.normal() * 0.2);
  t['embeddings.token_type_embeddings.weight'] = fill([cfg.type_vocab_size, H], () => r.normal() * 0.2);
  ln('embeddings.LayerNorm');
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    const p = `encoder.layer.${l}.`;
    linear(p + 'attention.self.query', H, H);
    linear(p + 'attention.self.key', H, H);
    linear(p + 'attention.self.value', H, H);
    linear(p + 'attention.output.dense', H, H);
    ln(p + 'attention.output.LayerNorm');
    linear(p + 'intermediate.dense', I, H);
    linear(p + 'output.dense', H, I);
    ln(p + 'output.LayerNorm');
  }
  return t;
}

// Rounds a float32 to the nearest binary16 (ties to even); returns its bits.
const f32buf = new Float32Array(1);
const u32buf = new Uint32Array(f32buf.buffer);
export function f16Bits(v) {
  f32buf[0] = v;
  const x = u32buf[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++; // a carry rounds into the exponent, as it should
  return sign | half;
}

// Widens binary16 bits to a number, exactly.
export function f16Value(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  if (exp === 0) return sign * mant * 2 ** -24;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

// Writes tensors ({name: {shape, data, dtype}}, dtype F32 for a
// Float32Array, F16 for a Uint16Array of bits, I64 for a BigInt64Array) as
// a safetensors file, in the order given.
export function safetensors(tensors, metadata) {
  const header = {};
  if (metadata) header.__metadata__ = metadata;
  let off = 0;
  const parts = [];
  for (const [name, t] of Object.entries(tensors)) {
    const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + bytes.length] };
    off += bytes.length;
    parts.push(bytes);
  }
  let js = JSON.stringify(header);
  js += ' '.repeat((8 - (Buffer.byteLength(js) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(js)));
  return Buffer.concat([len, Buffer.from(js), ...parts]);
}

// bertGraph is the ONNX model of BertModel's encoder (embeddings with
// token type 0 and given positions, the layers with an additive mask of
// float32's lowest value, as transformers builds it) followed by the
// sentence-transformers poolings: outputs last_hidden_state and, per item,
// mean, cls, max and each L2-normalized. w holds float32 weights by
// Hugging Face name (no "bert." prefix).
export function bertGraph(cfg, w) {
  const H = cfg.hidden_size;
  const NH = cfg.num_attention_heads;
  const D = H / NH;
  const nodes = [];
  const inits = [];
  let uid = 0;
  const FLOAT = onnx.TensorProto.DataType.FLOAT;
  const INT64 = onnx.TensorProto.DataType.INT64;
  const A = onnx.AttributeProto.AttributeType;
  const attr = {
    i: (name, i) => onnx.AttributeProto.create({ name, type: A.INT, i }),
    f: (name, f) => onnx.AttributeProto.create({ name, type: A.FLOAT, f }),
    ints: (name, ints) => onnx.AttributeProto.create({ name, type: A.INTS, ints }),
  };
  const op = (type, inputs, attrs = []) => {
    const out = `${type}_${uid++}`;
    nodes.push(onnx.NodeProto.create({ opType: type, input: inputs, output: [out], attribute: attrs, name: out }));
    return out;
  };
  const f32 = (dims, data) => {
    const name = `c${uid++}`;
    const arr = Float32Array.from(data);
    inits.push(onnx.TensorProto.create({ name, dims, dataType: FLOAT, rawData: new Uint8Array(arr.buffer) }));
    return name;
  };
  const i64 = (dims, data) => {
    const name = `c${uid++}`;
    const arr = BigInt64Array.from(data.map(BigInt));
    inits.push(onnx.TensorProto.create({ name, dims, dataType: INT64, rawData: new Uint8Array(arr.buffer) }));
    return name;
  };
  const weight = (name) => f32(w[name].shape, w[name].data);
  // PyTorch's Linear is x·Wᵀ + b with W [out, in]: store Wᵀ for MatMul.
  const linear = (x, name) => {
    const { shape, data } = w[`${name}.weight`];
    const [out, inn] = shape;
    const wt = new Float32Array(out * inn);
    for (let o = 0; o < out; o++) for (let i = 0; i < inn; i++) wt[i * out + o] = data[o * inn + i];
    return op('Add', [op('MatMul', [x, f32([inn, out], wt)]), weight(`${name}.bias`)]);
  };
  const layerNorm = (x, name) =>
    op('LayerNormalization', [x, weight(`${name}.weight`), weight(`${name}.bias`)], [attr.i('axis', -1), attr.f('epsilon', cfg.layer_norm_eps)]);

  const emb = op('Add', [
    op('Add', [op('Gather', [weight('embeddings.word_embeddings.weight'), 'input_ids']), op('Gather', [weight('embeddings.position_embeddings.weight'), 'position_ids'])]),
    op('Gather', [weight('embeddings.token_type_embeddings.weight'), 'token_type_ids']),
  ]);
  let x = layerNorm(emb, 'embeddings.LayerNorm');
  // (1 - mask) · lowest float32, shaped [B, 1, 1, L].
  const lowest = -3.4028234663852886e38;
  const maskAdd = op('Unsqueeze', [op('Mul', [op('Sub', [f32([], [1]), 'attention_mask']), f32([], [lowest])]), i64([2], [1, 2])]);
  const heads = (t, perm) => op('Transpose', [op('Reshape', [t, i64([4], [0, 0, NH, D])])], [attr.ints('perm', perm)]);
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    const p = `encoder.layer.${l}.`;
    const q = heads(linear(x, p + 'attention.self.query'), [0, 2, 1, 3]);
    const k = heads(linear(x, p + 'attention.self.key'), [0, 2, 3, 1]);
    const v = heads(linear(x, p + 'attention.self.value'), [0, 2, 1, 3]);
    let s = op('Mul', [op('MatMul', [q, k]), f32([], [1 / Math.sqrt(D)])]);
    s = op('Softmax', [op('Add', [s, maskAdd])], [attr.i('axis', -1)]);
    const ctx = op('Reshape', [op('Transpose', [op('MatMul', [s, v])], [attr.ints('perm', [0, 2, 1, 3])]), i64([3], [0, 0, H])]);
    x = layerNorm(op('Add', [linear(ctx, p + 'attention.output.dense'), x]), p + 'attention.output.LayerNorm');
    const inter = linear(x, p + 'intermediate.dense');
    // GELU as torch computes "gelu": x/2 · (1 + erf(x/√2)).
    const g = op('Mul', [op('Mul', [inter, f32([], [0.5])]), op('Add', [f32([], [1]), op('Erf', [op('Div', [inter, f32([], [Math.SQRT2])])])])]);
    x = layerNorm(op('Add', [linear(g, p + 'output.dense'), x]), p + 'output.LayerNorm');
  }
  const hidden = op('Identity', [x]);

  // sentence-transformers' Pooling: mean over attended tokens (count
  // clamped at 1e-9), the first token, or the max with padding set to -1e9.
  const m = op('Unsqueeze', ['attention_mask', i64([1], [2])]); // [B, L, 1]
  const axis1 = i64([1], [1]);
  const mean = op('Div', [
    op('ReduceSum', [op('Mul', [hidden, m]), axis1], [attr.i('keepdims', 0)]),
    op('Max', [op('ReduceSum', [m, axis1], [attr.i('keepdims', 0)]), f32([], [1e-9])]),
  ]);
  const cls = op('Gather', [hidden, i64([], [0])], [attr.i('axis', 1)]);
  const masked = op('Add', [op('Mul', [hidden, m]), op('Mul', [op('Sub', [f32([], [1]), m]), f32([], [-1e9])])]);
  const mx = op('ReduceMax', [masked], [attr.ints('axes', [1]), attr.i('keepdims', 0)]);
  const norm = (t) => op('LpNormalization', [t], [attr.i('axis', -1), attr.i('p', 2)]);
  const outputs = { last_hidden_state: hidden, mean, cls, max: mx, mean_norm: norm(mean), cls_norm: norm(cls), max_norm: norm(mx) };
  for (const [name, from] of Object.entries(outputs)) nodes.push(onnx.NodeProto.create({ opType: 'Identity', input: [from], output: [name], name: `out_${name}` }));

  const dim = (d) => (typeof d === 'string' ? { dimParam: d } : { dimValue: d });
  const vi = (name, type, dims) =>
    onnx.ValueInfoProto.create({ name, type: { tensorType: { elemType: type, shape: { dim: dims.map(dim) } } } });
  const graph = onnx.GraphProto.create({
    name: 'bert',
    node: nodes,
    initializer: inits,
    input: [vi('input_ids', INT64, ['B', 'L']), vi('attention_mask', FLOAT, ['B', 'L']), vi('position_ids', INT64, ['B', 'L']), vi('token_type_ids', INT64, ['B', 'L'])],
    output: [
      vi('last_hidden_state', FLOAT, ['B', 'L', H]),
      ...['mean', 'cls', 'max', 'mean_norm', 'cls_norm', 'max_norm'].map((n) => vi(n, FLOAT, ['B', H])),
    ],
  });
  const model = onnx.ModelProto.create({ irVersion: 8, opsetImport: [{ domain: '', version: 17 }], producerName: 'vramq model/bert/golden/onnx', graph });
  return onnx.ModelProto.encode(model).finish();
}

// feeds builds ONNX Runtime inputs for a batch of token-id lists, padded
// with 0 to the longest.
export function feeds(ort, batch) {
  const B = batch.length;
  const L = Math.max(...batch.map((x) => x.length));
  const ids = new BigInt64Array(B * L);
  const mask = new Float32Array(B * L);
  const pos = new BigInt64Array(B * L);
  const types = new BigInt64Array(B * L);
  batch.forEach((item, b) => {
    for (let p = 0; p < L; p++) {
      pos[b * L + p] = BigInt(p);
      if (p < item.length) {
        ids[b * L + p] = BigInt(item[p]);
        mask[b * L + p] = 1;
      }
    }
  });
  return {
    input_ids: new ort.Tensor('int64', ids, [B, L]),
    attention_mask: new ort.Tensor('float32', mask, [B, L]),
    position_ids: new ort.Tensor('int64', pos, [B, L]),
    token_type_ids: new ort.Tensor('int64', types, [B, L]),
  };
}
