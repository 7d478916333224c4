// ONNX Runtime's speed (items per wall second and per CPU second, all
// threads) on a model of all-MiniLM-L6-v2's shape, the
// baseline of model/bert's BenchmarkEmbed: same shapes, same batches (full-
// length items), same machine. Threads default to the CPU count, as Go's
// GOMAXPROCS does.
//
//   npm ci --ignore-scripts && node bench.mjs [runs] [threads]

import os from 'node:os';
import ort from 'onnxruntime-node';
import { bertGraph, feeds, generateWeights, rng } from './bert.mjs';

const runs = Number(process.argv[2] || 3);
const threads = Number(process.argv[3] || os.availableParallelism());
const cfg = {
  vocab_size: 30522,
  hidden_size: 384,
  num_hidden_layers: 6,
  num_attention_heads: 12,
  intermediate_size: 1536,
  max_position_embeddings: 512,
  type_vocab_size: 2,
  layer_norm_eps: 1e-12,
};
const session = await ort.InferenceSession.create(bertGraph(cfg, generateWeights(cfg, 1)), {
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  // ONNX Runtime's pool spins between ops by default, which bills CPU time
  // for waiting; off, its CPU seconds count work, as Go's do.
  extra: { session: { intra_op: { allow_spinning: '0' } } },
});
const r = rng(2);
console.log(`onnxruntime-node, ${threads} threads, ${runs} runs after one warm-up`);
for (const batch of [8, 32]) {
  for (const seq of [16, 128]) {
    const ids = Array.from({ length: batch }, () => Array.from({ length: seq }, () => r.int(0, cfg.vocab_size)));
    const f = feeds(ort, ids);
    await session.run(f);
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    for (let i = 0; i < runs; i++) await session.run(f);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = process.cpuUsage(c0);
    const cpu = (c.user + c.system) / 1e6;
    console.log(
      `batch=${batch}/seq=${seq}\t${((s / runs) * 1e9).toFixed(0)} ns/op\t${((runs * batch) / s).toFixed(1)} items/s\t${((runs * batch * seq) / s).toFixed(0)} tokens/s\t${((runs * batch) / cpu).toFixed(2)} items/cpu-s`,
    );
  }
}
