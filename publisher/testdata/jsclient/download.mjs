// The official OpenAI JavaScript SDK downloads a file's content, as a team
// would fetch a batch's output with it: files.content(id), then the bytes.
//
// Run by TestLargeDownloadUnderLambdaWithTheJavaScriptSDK
// (publisher/download_test.go), which sets:
//   OPENAI_BASE_URL, OPENAI_API_KEY   read by the SDK itself
//   VRAMQ_FILE_ID                     the file to download
// Prints one JSON line: the final response's status and host, whether it was
// reached by a redirect, and the bytes' count and SHA-256, for the test to
// compare with the file it stored. Any error exits 1.

import OpenAI from 'openai';
import { VERSION } from 'openai/version';
import { createHash } from 'node:crypto';

async function main() {
  const id = process.env.VRAMQ_FILE_ID;
  if (!id) throw new Error('VRAMQ_FILE_ID is not set');
  const client = new OpenAI({ maxRetries: 0 });
  const res = await client.files.content(id);
  const buf = Buffer.from(await res.arrayBuffer());
  console.log(JSON.stringify({
    sdk: `openai-node ${VERSION}`,
    status: res.status,
    redirected: res.redirected,
    host: new URL(res.url).host,
    bytes: buf.length,
    sha256: createHash('sha256').update(buf).digest('hex'),
  }));
}

main().catch((err) => {
  console.error(`download.mjs: ${err?.stack ?? err}`);
  process.exit(1);
});
