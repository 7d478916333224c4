// The official OpenAI JavaScript SDK (npm openai, pinned by package-lock.json)
// runs an embeddings batch against vramq's publisher, as a team would with
// the client it already uses: upload, create, poll, download, list, and the
// SDK's own error classes for OpenAI-shaped errors.
//
// Run by TestBatchWithTheOpenAIJavaScriptSDK (publisher/jsbatch_test.go),
// which starts the publisher and a subscriber and sets:
//   OPENAI_BASE_URL, OPENAI_API_KEY   read by the SDK itself
//   VRAMQ_BATCH_LINES                 how many embeddings lines to send
//   VRAMQ_BATCH_DEADLINE_S            how long to poll for completed
// Any mismatch exits 1 with what differed; success prints one JSON summary
// on stdout.

import OpenAI, { ConflictError, NotFoundError, toFile } from 'openai';
import { VERSION } from 'openai/version';
import { checks } from './checks.mjs';

const { fail, check, describe } = checks('batch.mjs', OpenAI.APIError);

async function expectError(what, cls, status, code, param, call) {
  try {
    const got = await call();
    fail(`${what}: succeeded with ${JSON.stringify(got)}; want ${cls.name} ${status}`);
  } catch (err) {
    check(
      err instanceof cls && err.status === status && err.code === code && err.param === param &&
        err.type === 'invalid_request_error' && typeof err.error?.message === 'string' && err.error.message !== '',
      `${what}: ${describe(err)}; want ${cls.name} ${status} with code ${code}, param ${param}, type invalid_request_error and a message`,
    );
    return { status: err.status, code: err.code, param: err.param };
  }
}

async function main() {
  const n = Number(process.env.VRAMQ_BATCH_LINES ?? 6);
  const deadlineS = Number(process.env.VRAMQ_BATCH_DEADLINE_S ?? 60);
  check(Number.isInteger(n) && n > 0, `VRAMQ_BATCH_LINES=${process.env.VRAMQ_BATCH_LINES} is not a count`);
  check(process.env.OPENAI_BASE_URL, 'OPENAI_BASE_URL is not set');

  // No retries: a flaky answer is a finding here, not something to hide.
  const client = new OpenAI({ maxRetries: 0 });

  const ids = Array.from({ length: n }, (_, i) => `js-${i}`);
  const jsonl = ids
    .map((id, i) =>
      JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/embeddings', body: { model: 'ref', input: `the ${i} th text from JavaScript` } }),
    )
    .join('\n') + '\n';

  const file = await client.files.create({
    file: await toFile(Buffer.from(jsonl), 'js-embed.jsonl', { type: 'application/jsonl' }),
    purpose: 'batch',
  });
  check(file.object === 'file' && file.purpose === 'batch' && file.id && file.bytes === Buffer.byteLength(jsonl),
    `uploaded file: ${JSON.stringify(file)}`);

  const created = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/embeddings',
    completion_window: '24h',
    metadata: { client: 'openai-node' },
  });
  check(created.object === 'batch' && created.id.startsWith('batch_') && created.input_file_id === file.id &&
    created.endpoint === '/v1/embeddings' && created.status === 'validating' && created.metadata?.client === 'openai-node',
  `created batch: ${JSON.stringify(created)}`);

  const deadline = Date.now() + deadlineS * 1000;
  let batch = created;
  const seen = [batch.status];
  while (batch.status !== 'completed') {
    check(['validating', 'in_progress', 'finalizing'].includes(batch.status),
      `batch ${batch.id} is ${batch.status}, which does not lead to completed: ${JSON.stringify(batch)}`);
    check(Date.now() < deadline, `batch ${batch.id} is still ${batch.status} after ${deadlineS}s`);
    await new Promise((r) => setTimeout(r, 200));
    batch = await client.batches.retrieve(created.id);
    if (seen.at(-1) !== batch.status) seen.push(batch.status);
  }
  check(batch.request_counts.completed === n && batch.request_counts.failed === 0 && batch.output_file_id &&
    batch.error_file_id == null && batch.completed_at >= batch.in_progress_at,
  `completed batch: ${JSON.stringify(batch)}`);

  const res = await client.files.content(batch.output_file_id);
  const text = await res.text();
  const lines = text.split('\n').filter((l) => l !== '');
  check(lines.length === n, `${lines.length} output lines; want ${n}: ${text.slice(0, 500)}`);
  let dims = 0;
  lines.forEach((raw, i) => {
    let l;
    try {
      l = JSON.parse(raw);
    } catch (err) {
      fail(`output line ${i} is not JSON (${err.message}): ${raw}`);
    }
    check(l.custom_id === ids[i], `output line ${i} has custom_id ${JSON.stringify(l.custom_id)}; want ${ids[i]} (the file's order)`);
    const short = raw.length > 300 ? `${raw.slice(0, 300)}…` : raw;
    const emb = l.response?.body?.data?.[0]?.embedding;
    for (const [ok, what] of [
      [typeof l.id === 'string' && l.id.startsWith('batch_req_'), 'an id starting batch_req_'],
      [l.error === null, 'error null (present, as OpenAI writes it)'],
      [l.response?.status_code === 200, 'response.status_code 200'],
      [typeof l.response?.request_id === 'string' && l.response.request_id !== '', 'a response.request_id'],
      [l.response?.body?.object === 'list', 'a body with object "list"'],
      [Array.isArray(emb) && emb.length > 0 && emb.every(Number.isFinite), 'a non-empty body.data[0].embedding of numbers'],
    ]) {
      check(ok, `output line ${i} lacks ${what}: ${short}`);
    }
    if (i === 0) dims = emb.length;
    check(emb.length === dims, `output line ${i} has ${emb.length} dimensions, line 0 has ${dims}`);
  });

  // Through the SDK's auto-pagination (for await), as a client looks for a batch.
  let listed = false;
  for await (const b of client.batches.list({ limit: 2 })) {
    if (b.id === batch.id) {
      listed = b.status === 'completed';
      break;
    }
  }
  check(listed, `batches.list has no completed ${batch.id}`);

  const notFound = await expectError('retrieving a batch that does not exist', NotFoundError, 404, 'not_found', 'id',
    () => client.batches.retrieve('batch_doesnotexist'));
  const conflict = await expectError('cancelling a completed batch', ConflictError, 409, 'batch_not_cancellable', null,
    () => client.batches.cancel(batch.id));

  console.log(JSON.stringify({
    sdk: `openai-node ${VERSION}`,
    node: process.version,
    file_id: file.id,
    batch_id: batch.id,
    statuses: seen,
    request_counts: batch.request_counts,
    output_file_id: batch.output_file_id,
    output_lines: lines.length,
    dimensions: dims,
    listed,
    errors: { not_found: notFound, conflict },
  }));
}

main().catch((err) => fail(describe(err)));
