// Writes hfjs-golden.json: what an independent implementation of Hugging
// Face's tokenizer.json (transformers.js, which follows the Rust library's
// file format) makes of the generated model's tokenizer. Regenerate after
// changing model.go:
//
//   go run ./gpu/verify/engine -write-model /tmp/vramq-engine-model
//   npm install --prefix /tmp/hfjs --ignore-scripts @huggingface/transformers@3
//   NODE_PATH=/tmp/hfjs/node_modules node gpu/verify/engine/testdata/hfjs.mjs /tmp/vramq-engine-model \
//     >gpu/verify/engine/testdata/hfjs-golden.json
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.NODE_PATH, 'x.js'));
const { env, AutoTokenizer } = require('@huggingface/transformers');
const dir = path.resolve(process.argv[2]);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(dir) + '/';
const tok = await AutoTokenizer.from_pretrained(path.basename(dir));
const texts = [
  'The BATCH queue, zebra',
  'item b0-1-2 the batch queue the batch queue',
  'online o3-4 a user of the product asks',
  'Héllo, wörld! 42 × 7 = 294?',
  '',
];
const out = {
  generator: `transformers.js ${env.version}`,
  encode: texts.map((text) => ({ text, ids: Array.from(tok.encode(text)) })),
  decode: { ids: [100, 200, 300, 900, 1023, 3], text: tok.decode([100, 200, 300, 900, 1023, 3]) },
  chat: tok.apply_chat_template([{ role: 'user', content: 'hello there' }], { tokenize: false, add_generation_prompt: true }),
  eos_token_id: tok.eos_token_id,
  bos_token_id: tok.bos_token_id,
};
console.log(JSON.stringify(out, null, 1));
