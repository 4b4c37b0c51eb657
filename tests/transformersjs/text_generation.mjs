// transformers.js's text-generation pipeline on a causal LM's folder as `opreg export` (or
// `opreg llm export --layout optimum`) writes it: optimum's flat layout, model.onnx beside
// config.json, generation_config.json and the tokenizer's files, loaded unchanged with
// `subfolder: ''`, fully offline.
//
// usage: node text_generation.mjs FOLDER '{"texts": ["..."], "generate": {"max_new_tokens": 16}}'
// prints one JSON line: {"tokens": [[...], ...], "input_ids": [[...], ...], "texts": ["...", ...], "versions": {...}}
//   tokens: model.generate's ids for each text tokenized alone (the prompt, then what follows);
//   texts: the pipeline's generated_text for the same texts and options.
// transformers.js is resolved from OPREG_TJS_DIR (a folder whose node_modules holds
// @huggingface/transformers; default /work/sidevenvs/tjs).
import { createRequire } from 'node:module';
import path from 'node:path';

const [folder, optionsJson] = process.argv.slice(2);
if (!folder) {
    console.error('usage: node text_generation.mjs FOLDER [OPTIONS_JSON]');
    process.exit(2);
}
const options = JSON.parse(optionsJson ?? '{}');
const texts = options.texts ?? ['the quick brown fox'];
const generate = { do_sample: false, num_beams: 1, ...(options.generate ?? {}) };

const tjsDir = process.env.OPREG_TJS_DIR ?? '/work/sidevenvs/tjs';
const require = createRequire(path.join(path.resolve(tjsDir), 'package.json'));
const { pipeline, env } = require('@huggingface/transformers');

const dir = path.resolve(folder);
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(dir) + '/';
env.useFSCache = false;

const pipe = await pipeline('text-generation', path.basename(dir), {
    local_files_only: true, dtype: 'fp32', device: 'cpu', subfolder: '',
});
const tokens = [];
const inputIds = [];
for (const text of texts) {  // one at a time: a decoder-only batch would be padded on the left
    const inputs = pipe.tokenizer(text);
    const ids = await pipe.model.generate({ ...inputs, ...generate });
    tokens.push(ids.tolist()[0].map(Number));
    inputIds.push(inputs.input_ids.tolist()[0].map(Number));
}
const generated = [];
for (const text of texts) {
    const out = await pipe(text, generate);
    generated.push(out[0].generated_text);
}
console.log(JSON.stringify({
    tokens,
    input_ids: inputIds,
    texts: generated,
    versions: { transformers_js: env.version, onnxruntime: env.backends?.onnx?.versions?.node ?? null, node: process.version },
}));
