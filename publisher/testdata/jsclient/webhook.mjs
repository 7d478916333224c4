// The official OpenAI JavaScript SDK (npm openai, pinned by package-lock.json)
// verifies and reads a webhook event vramq's publisher sent, as a team's
// receiver would: client.webhooks.unwrap with the endpoint's secret.
//
// Run by TestBatchWebhooksWithTheOpenAIJavaScriptSDK (publisher/webhooks_test.go),
// which writes on stdin one JSON object: {"body": the request body as sent,
// "headers": {name: value}, "secret": "whsec_…"}. A payload the SDK refuses
// exits 1 with its error; one it takes prints the event as the SDK read it.

import OpenAI from 'openai';

let input = '';
for await (const chunk of process.stdin) input += chunk;
const { body, headers, secret } = JSON.parse(input);
const client = new OpenAI({ apiKey: 'unused', webhookSecret: secret });
try {
  const event = await client.webhooks.unwrap(body, headers);
  console.log(JSON.stringify(event));
} catch (err) {
  console.error(`webhook.mjs: ${err.constructor.name}: ${err.message}`);
  process.exit(1);
}
