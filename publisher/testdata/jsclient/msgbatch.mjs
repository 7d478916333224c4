// The official Anthropic JavaScript SDK (npm @anthropic-ai/sdk, pinned by
// package-lock.json) runs Message Batches against vramq's publisher, as a
// team would with the client it already uses: create, poll, the list's
// auto-pagination, cancel mid-run, the results stream, delete, and the SDK's
// own error classes for Anthropic-shaped errors.
//
// Run by TestMessageBatchesWithTheAnthropicJavaScriptSDK
// (publisher/jsmsgbatch_test.go), which starts the publisher and a
// subscriber on a fake model server and sets:
//   ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY   read by the SDK itself
//   VRAMQ_OTHER_API_KEY                     another tenant's key
//   VRAMQ_BATCH_REQUESTS                    requests of the batch run to its end
//   VRAMQ_CANCEL_REQUESTS                   requests of the batch canceled mid-run
//   VRAMQ_BATCH_DEADLINE_S                  how long to poll for ended
// Any mismatch exits 1 with what differed; success prints one JSON summary
// on stdout.

import Anthropic, { BadRequestError, NotFoundError } from '@anthropic-ai/sdk';
import { VERSION } from '@anthropic-ai/sdk/version';
import { checks } from './checks.mjs';

const { fail, check, describe } = checks('msgbatch.mjs', Anthropic.APIError);

// expectError runs call, which must fail with the SDK's class cls; it
// returns the status and Anthropic's error type the SDK read.
async function expectError(what, cls, call) {
  try {
    const got = await call();
    fail(`${what}: succeeded with ${JSON.stringify(got)}; want ${cls.name}`);
  } catch (err) {
    check(err instanceof cls, `${what}: ${describe(err)}; want ${cls.name}`);
    return { status: err.status, type: err.error?.error?.type ?? '' };
  }
}

const client = new Anthropic();
const other = new Anthropic({ apiKey: process.env.VRAMQ_OTHER_API_KEY });
const n = Number(process.env.VRAMQ_BATCH_REQUESTS);
const large = Number(process.env.VRAMQ_CANCEL_REQUESTS);
const deadline = Date.now() + 1000 * Number(process.env.VRAMQ_BATCH_DEADLINE_S);

function requests(count, maxTokens) {
  return Array.from({ length: count }, (_, i) => ({
    custom_id: `js-${i}`,
    params: { model: 'fake-model', max_tokens: maxTokens, messages: [{ role: 'user', content: `question ${i}` }] },
  }));
}

async function poll(id, done) {
  const statuses = [];
  for (;;) {
    const b = await client.messages.batches.retrieve(id);
    if (statuses.at(-1) !== b.processing_status) statuses.push(b.processing_status);
    if (done(b)) return { batch: b, statuses };
    check(Date.now() < deadline, `batch ${id} is ${JSON.stringify(b)} at the deadline`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const created = await client.messages.batches.create({ requests: requests(n, 8) });
check(created.type === 'message_batch' && created.processing_status === 'in_progress' &&
  created.request_counts.processing === n && created.results_url === null &&
  Date.parse(created.expires_at) - Date.parse(created.created_at) === 24 * 3600 * 1000,
  `created: ${JSON.stringify(created)}`);
const toCancel = await client.messages.batches.create({ requests: requests(large, 32) });
const notFound = await expectError("another tenant's retrieve", NotFoundError,
  () => other.messages.batches.retrieve(created.id));
const badRequest = await expectError('a delete before the end', BadRequestError,
  () => client.messages.batches.delete(toCancel.id));

// Cancel the large one once some of it has run.
await poll(toCancel.id, (b) => b.request_counts.succeeded > 0);
const canceling = await client.messages.batches.cancel(toCancel.id);
check(canceling.processing_status === 'canceling' && canceling.cancel_initiated_at !== null,
  `cancel: ${JSON.stringify(canceling)}`);
const { batch: canceled } = await poll(toCancel.id, (b) => b.processing_status === 'ended');

const { batch: ended, statuses } = await poll(created.id, (b) => b.processing_status === 'ended');
const results = [];
for await (const r of await client.messages.batches.results(created.id)) {
  check(r.custom_id === `js-${results.length}`, `result ${results.length} is ${r.custom_id}`);
  check(r.result.type !== 'succeeded' || (r.result.message.role === 'assistant' && r.result.message.content[0]?.text),
    `result ${JSON.stringify(r)}`);
  results.push(r.result.type);
}

// The auto-pager, one batch a page: both batches, newest first.
const listed = [];
for await (const b of client.messages.batches.list({ limit: 1 })) listed.push(b.id);

const deleted = await client.messages.batches.delete(created.id);
check(deleted.id === created.id && deleted.type === 'message_batch_deleted', `delete: ${JSON.stringify(deleted)}`);
const gone = await expectError('a retrieve after delete', NotFoundError, () => client.messages.batches.retrieve(created.id));

console.log(JSON.stringify({
  sdk: `anthropic-sdk-typescript ${VERSION}`,
  node: process.versions.node,
  batch_id: created.id,
  canceled_id: toCancel.id,
  statuses,
  request_counts: ended.request_counts,
  canceled_counts: canceled.request_counts,
  results,
  listed,
  errors: { not_found: notFound, bad_request: badRequest, gone },
}));
