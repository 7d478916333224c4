// The official OpenAI JavaScript SDK (npm openai, pinned by package-lock.json)
// runs a batch of each endpoint of issue 35's item 1 against vramq's
// publisher (/v1/responses, /v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/moderations), each with output_expires_after, and
// checks the usage it sums; then a batch cancelled mid-flight and one that
// expires mid-run, where every line must be in one of the two files.
//
// Run by TestBatchFlowsWithTheOpenAIJavaScriptSDK
// (publisher/jsbatchflows_test.go), which starts the publisher (serving all
// five endpoints) and a subscriber on the fake model server and sets:
//   OPENAI_BASE_URL, OPENAI_API_KEY   read by the SDK itself
//   VRAMQ_BATCH_LINES                 lines of each endpoint's batch
//   VRAMQ_SLOW_LINES                  lines of the cancelled and the expired batch
//   VRAMQ_OUTPUT_TOKENS               output tokens the fake gives a quick line
//   VRAMQ_BATCH_DEADLINE_S            how long to poll for an end
// No clock moves a batch past its 24 h window, so for expiry the script
// prints {"expire": id} on stdout and waits for a line on stdin: the test
// has then moved the batch's expires_at into the past.
// Any mismatch exits 1 with what differed; success prints one JSON summary
// as its last line on stdout.

import OpenAI from 'openai';
import { VERSION } from 'openai/version';
import { createInterface } from 'node:readline';
import { checks } from './checks.mjs';

const { check } = checks('batchflows.mjs', OpenAI.APIError);

const client = new OpenAI({ maxRetries: 0 });
const n = Number(process.env.VRAMQ_BATCH_LINES);
const slow = Number(process.env.VRAMQ_SLOW_LINES);
const outTokens = Number(process.env.VRAMQ_OUTPUT_TOKENS);
const deadline = Date.now() + 1000 * Number(process.env.VRAMQ_BATCH_DEADLINE_S);
const keep = 7200; // output_expires_after's seconds: neither OpenAI's nor vramq's default
const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// Each endpoint's request body for line i, and what its answer's body must hold.
const endpoints = {
  '/v1/responses': {
    body: (i) => ({ model: 'fake-model', input: `question ${i}`, max_output_tokens: 20 }),
    ok: (b) => b.object === 'response' && b.status === 'completed' &&
      b.output?.some((o) => o.content?.some((c) => c.type === 'output_text' && c.text !== '')) &&
      b.usage?.output_tokens === outTokens,
    tokens: (u) => u?.input_tokens > 0 && u.output_tokens === n * outTokens,
  },
  '/v1/chat/completions': {
    body: (i) => ({ model: 'fake-model', messages: [{ role: 'user', content: `question ${i}` }], max_tokens: 20 }),
    ok: (b) => b.object === 'chat.completion' && b.choices?.[0]?.message?.role === 'assistant' &&
      b.choices[0].message.content !== '' && b.usage?.completion_tokens === outTokens,
    tokens: (u) => u?.input_tokens > 0 && u.output_tokens === n * outTokens,
  },
  '/v1/completions': {
    body: (i) => ({ model: 'fake-model', prompt: `question ${i}`, max_tokens: 20 }),
    ok: (b) => b.object === 'text_completion' && typeof b.choices?.[0]?.text === 'string' && b.choices[0].text !== '' &&
      b.usage?.completion_tokens === outTokens,
    tokens: (u) => u?.input_tokens > 0 && u.output_tokens === n * outTokens,
  },
  '/v1/embeddings': {
    body: (i) => ({ model: 'fake-model', input: `text ${i}` }),
    ok: (b) => b.object === 'list' && Array.isArray(b.data?.[0]?.embedding) && b.data[0].embedding.length > 0 &&
      b.usage?.prompt_tokens > 0,
    tokens: (u) => u?.input_tokens > 0 && u.output_tokens === 0,
  },
  '/v1/moderations': {
    body: (i) => ({ model: 'fake-model', input: [`calm ${i}`, 'an attack'] }),
    ok: (b) => b.results?.length === 2 && b.results[0].flagged === false && b.results[1].flagged === true,
    // A moderation's answer reports no tokens, and docs/api.md says a batch
    // whose answers report none has no usage.
    tokens: (u) => u === undefined,
  },
};

async function upload(name, lines) {
  const jsonl = lines.map((l) => JSON.stringify(l)).join('\n') + '\n';
  const f = await client.files.create({ file: await OpenAI.toFile(Buffer.from(jsonl), name), purpose: 'batch' });
  return f.id;
}

async function poll(id, done) {
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (done(b)) return b;
    check(Date.now() < deadline, `batch ${id} is ${JSON.stringify(b)} at the deadline`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function lines(fileID) {
  if (fileID == null) return [];
  const text = await (await client.files.content(fileID)).text();
  return text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
}

// checkKept: a batch's output or error file is kept output_expires_after
// from its own created_at, as OpenAI's reference says of the anchor.
async function checkKept(batchID, fileID) {
  if (fileID == null) return;
  const f = await client.files.retrieve(fileID);
  check(f.expires_at - f.created_at === keep, `batch ${batchID}'s file ${JSON.stringify(f)} is not kept ${keep}s`);
}

const summary = { sdk: `openai-node ${VERSION}`, node: process.version, endpoints: {} };

for (const [url, ep] of Object.entries(endpoints)) {
  const ids = Array.from({ length: n }, (_, i) => `${url.slice(4)}-${i}`);
  const file = await upload(`${url.slice(4).replace('/', '-')}.jsonl`,
    ids.map((id, i) => ({ custom_id: id, method: 'POST', url, body: ep.body(i) })));
  const created = await client.batches.create({ input_file_id: file, endpoint: url, completion_window: '24h',
    output_expires_after: { anchor: 'created_at', seconds: keep } });
  check(created.endpoint === url, `${url}: created ${JSON.stringify(created)}`);
  const b = await poll(created.id, (b) => !['validating', 'in_progress', 'finalizing'].includes(b.status));
  check(b.status === 'completed' && b.request_counts.completed === n && b.request_counts.failed === 0 &&
    b.error_file_id == null, `${url}: ended ${JSON.stringify(b)}`);
  const u = b.usage;
  check(ep.tokens(u) && (u === undefined || u.total_tokens === u.input_tokens + u.output_tokens),
    `${url}: usage ${JSON.stringify(u)}`);
  const out = await lines(b.output_file_id);
  check(out.length === n, `${url}: ${out.length} output lines; want ${n}`);
  out.forEach((l, i) => check(l.custom_id === ids[i] && l.error === null && l.response?.status_code === 200 &&
    ep.ok(l.response.body), `${url}: output line ${i}: ${JSON.stringify(l)}`));
  await checkKept(b.id, b.output_file_id);
  summary.endpoints[url] = { batch_id: b.id, completed: b.request_counts.completed,
    usage: u && { input_tokens: u.input_tokens, output_tokens: u.output_tokens, total_tokens: u.total_tokens } };
}

// ended runs a slow chat batch until some of it has completed, calls stop
// on it, and polls it to its end; every line must then be in exactly one of
// the output file (answered) and the error file (code).
async function ended(name, stop, status, code) {
  const ids = Array.from({ length: slow }, (_, i) => `${name}-${i}`);
  const file = await upload(`${name}.jsonl`, ids.map((id, i) => ({ custom_id: id, method: 'POST', url: '/v1/chat/completions',
    body: { model: 'fake-model', messages: [{ role: 'user', content: `slow question ${i}` }], max_tokens: 64 } })));
  const created = await client.batches.create({ input_file_id: file, endpoint: '/v1/chat/completions',
    completion_window: '24h', output_expires_after: { anchor: 'created_at', seconds: keep } });
  await poll(created.id, (b) => b.request_counts.completed > 0);
  await stop(created.id);
  const b = await poll(created.id, (b) => !['validating', 'in_progress', 'finalizing', 'cancelling'].includes(b.status));
  check(b.status === status && b[`${status}_at`] >= b.created_at, `${name}: ended ${JSON.stringify(b)}; want ${status}`);
  const out = await lines(b.output_file_id);
  const errs = await lines(b.error_file_id);
  const seen = new Map();
  for (const l of out) {
    check(l.response?.status_code === 200 && l.error === null, `${name}: output line ${JSON.stringify(l)}`);
    seen.set(l.custom_id, (seen.get(l.custom_id) ?? 0) + 1);
  }
  for (const l of errs) {
    check(l.response == null && l.error?.code === code && l.error.message !== '', `${name}: error line ${JSON.stringify(l)}; want ${code}`);
    seen.set(l.custom_id, (seen.get(l.custom_id) ?? 0) + 1);
  }
  check(ids.every((id) => seen.get(id) === 1) && seen.size === slow,
    `${name}: ${out.length} output and ${errs.length} error lines do not hold each of the ${slow} lines once`);
  check(b.request_counts.total === slow && b.request_counts.completed === out.length && b.request_counts.failed === errs.length &&
    out.length > 0 && errs.length > 0, `${name}: counts ${JSON.stringify(b.request_counts)} for ${out.length} output and ${errs.length} error lines`);
  check(b.usage?.output_tokens > 0, `${name}: usage ${JSON.stringify(b.usage)} of the lines that ran`);
  await checkKept(b.id, b.output_file_id);
  await checkKept(b.id, b.error_file_id);
  return { batch_id: b.id, completed: out.length, failed: errs.length };
}

summary.cancelled = await ended('cancel', async (id) => {
  const c = await client.batches.cancel(id);
  check(c.status === 'cancelling' && c.cancelling_at !== null, `cancel: ${JSON.stringify(c)}`);
}, 'cancelled', 'batch_cancelled');

summary.expired = await ended('expire', async (id) => {
  console.log(JSON.stringify({ expire: id }));
  const { done } = await stdinLines.next();
  check(!done, 'stdin ended before the batch was made to expire');
}, 'expired', 'batch_expired');

console.log(JSON.stringify(summary));
process.exit(0);
