// Generates the golden test data of model/bert: two small BERT model
// directories as Hugging Face and sentence-transformers lay them out, with
// weights generated here, and the outputs ONNX Runtime (CPU) computes for
// them on fixed batches of token ids, padded in the batch.
//
//   npm ci --ignore-scripts && node gen.mjs ../../testdata/model
//
// (`make golden-onnx` from the repository root.) The ONNX graph is built
// from standard ops in bert.mjs; ONNX Runtime is the oracle.

import fs from 'node:fs';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { bertGraph, f16Bits, f16Value, feeds, generateWeights, rng, safetensors } from './bert.mjs';

const out = process.argv[2];
if (!out) throw new Error('usage: node gen.mjs OUTDIR');

const cfg = {
  vocab_size: 512,
  hidden_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  intermediate_size: 128,
  max_position_embeddings: 128,
  type_vocab_size: 2,
  layer_norm_eps: 1e-12,
  hidden_act: 'gelu',
  position_embedding_type: 'absolute',
  model_type: 'bert',
};

const CLS = 101;
const SEP = 102;

// Batches of [CLS] … [SEP] items of mixed lengths: one at the longest
// position, one of a single token, id 0 (the pad id) and the last id of the
// vocabulary inside a text, and the first item of the first batch again
// alone, unpadded.
function batches() {
  const r = rng(7);
  const item = (n) => {
    if (n === 1) return [CLS];
    const ids = [CLS];
    for (let i = 1; i < n - 1; i++) ids.push(r.int(103, cfg.vocab_size));
    ids.push(SEP);
    return ids;
  };
  const a = [item(9), item(2), item(23), item(5)];
  a[2][4] = 0;
  a[2][5] = cfg.vocab_size - 1;
  const b = [item(128), item(17), item(1)];
  const c = [a[0].slice()];
  const d = [item(64), item(63), item(40), item(64), item(3)];
  return [a, b, c, d];
}

const round9 = (v) => Number(Math.fround(v).toPrecision(9)); // float32 round-trips through 9 digits

async function model(name, { seed, f16, prefix, architecture, pooling, normalize, maxSeqLength, extra }) {
  const dir = path.join(out, name);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(path.join(dir, '1_Pooling'), { recursive: true });

  const w = generateWeights(cfg, seed);
  const file = {};
  for (const [n, t] of Object.entries(w)) {
    if (f16) {
      // The checkpoint holds half precision; the oracle runs the same
      // values widened to float32, as the loader widens them.
      const bits = Uint16Array.from(t.data, f16Bits);
      t.data = Float32Array.from(bits, f16Value);
      file[prefix + n] = { dtype: 'F16', shape: t.shape, data: bits };
    } else {
      file[prefix + n] = { dtype: 'F32', shape: t.shape, data: t.data };
    }
  }
  Object.assign(file, extra(w));
  fs.writeFileSync(path.join(dir, 'model.safetensors'), safetensors(file, { format: 'pt' }));

  const config = { architectures: [architecture], ...cfg };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 2) + '\n');
  const modules = [
    { idx: 0, name: '0', path: '', type: 'sentence_transformers.models.Transformer' },
    { idx: 1, name: '1', path: '1_Pooling', type: 'sentence_transformers.models.Pooling' },
  ];
  if (normalize) modules.push({ idx: 2, name: '2', path: '2_Normalize', type: 'sentence_transformers.models.Normalize' });
  fs.writeFileSync(path.join(dir, 'modules.json'), JSON.stringify(modules, null, 2) + '\n');
  const poolCfg = {
    word_embedding_dimension: cfg.hidden_size,
    pooling_mode_cls_token: pooling === 'cls',
    pooling_mode_mean_tokens: pooling === 'mean',
    pooling_mode_max_tokens: pooling === 'max',
    pooling_mode_mean_sqrt_len_tokens: false,
    pooling_mode_weightedmean_tokens: false,
    pooling_mode_lasttoken: false,
    include_prompt: true,
  };
  fs.writeFileSync(path.join(dir, '1_Pooling', 'config.json'), JSON.stringify(poolCfg, null, 2) + '\n');
  if (maxSeqLength) {
    fs.writeFileSync(path.join(dir, 'sentence_bert_config.json'), JSON.stringify({ max_seq_length: maxSeqLength, do_lower_case: false }, null, 2) + '\n');
  }

  const session = await ort.InferenceSession.create(bertGraph(cfg, w), { intraOpNumThreads: 1 });
  const golden = {
    generator: 'model/bert/golden/onnx/gen.mjs',
    oracle: `onnxruntime-node ${JSON.parse(fs.readFileSync(new URL('./node_modules/onnxruntime-node/package.json', import.meta.url))).version} (CPU)`,
    note: 'outputs of ONNX Runtime on the weights of model.safetensors, for every pooling, each also L2-normalized',
    batches: [],
  };
  for (const batch of batches()) {
    const res = await session.run(feeds(ort, batch));
    const outputs = {};
    for (const k of ['mean', 'cls', 'max', 'mean_norm', 'cls_norm', 'max_norm']) {
      const t = res[k];
      const [B, Hd] = t.dims;
      outputs[k] = Array.from({ length: B }, (_, b) => Array.from(t.data.subarray(b * Hd, (b + 1) * Hd), round9));
    }
    golden.batches.push({ ids: batch, outputs });
  }
  fs.writeFileSync(path.join(dir, 'golden.json'), JSON.stringify(golden) + '\n');
  console.log(`${dir}: ${fs.statSync(path.join(dir, 'model.safetensors')).size} bytes of weights, ${golden.batches.length} batches`);
}

// A BertModel checkpoint in F32 as sentence-transformers saves it: no
// prefix, with the position_ids buffer and the pooler (unused by
// sentence embeddings), mean pooling, Normalize, max_seq_length.
await model('tiny-f32', {
  seed: 1,
  f16: false,
  prefix: '',
  architecture: 'BertModel',
  pooling: 'mean',
  normalize: true,
  maxSeqLength: 128,
  extra: () => {
    const r = rng(99);
    const H = cfg.hidden_size;
    return {
      'embeddings.position_ids': { dtype: 'I64', shape: [1, cfg.max_position_embeddings], data: BigInt64Array.from({ length: cfg.max_position_embeddings }, (_, i) => BigInt(i)) },
      'pooler.dense.weight': { dtype: 'F32', shape: [H, H], data: Float32Array.from({ length: H * H }, () => r.normal() / 8) },
      'pooler.dense.bias': { dtype: 'F32', shape: [H], data: Float32Array.from({ length: H }, () => r.normal() / 8) },
    };
  },
});

// A BertForMaskedLM checkpoint in F16: "bert."-prefixed names, a masked-LM
// head to skip, CLS pooling, no Normalize, no sentence_bert_config.json.
await model('tiny-f16', {
  seed: 2,
  f16: true,
  prefix: 'bert.',
  architecture: 'BertForMaskedLM',
  pooling: 'cls',
  normalize: false,
  maxSeqLength: 0,
  extra: () => ({
    'cls.predictions.bias': { dtype: 'F16', shape: [cfg.vocab_size], data: new Uint16Array(cfg.vocab_size) },
  }),
});
