// transformers.js's text2text-generation pipeline on a folder `opreg export` wrote (optimum's flat
// layout: encoder_model.onnx and decoder_model_merged.onnx beside config.json and the tokenizer's
// files, loaded unchanged with `subfolder: ''`), fully offline.
//
// usage: node text2text_generation.mjs FOLDER '{"texts": ["..."], "generate": {"max_new_tokens": 8}}'
// prints one JSON line: {"tokens": [[...], ...], "texts": ["...", ...], "versions": {...}}
//   tokens: model.generate's ids for the tokenized texts (padded as the pipeline pads them), the
//   decoder's start token first; texts: the pipeline's generated_text for the same texts and options.
// transformers.js is resolved from OPREG_TJS_DIR (a folder whose node_modules holds
// @huggingface/transformers), which the suite sets (tests/transformersjs_runtime.py).
import { createRequire } from 'node:module';
import path from 'node:path';

const [folder, optionsJson] = process.argv.slice(2);
if (!folder) {
    console.error('usage: node text2text_generation.mjs FOLDER [OPTIONS_JSON]');
    process.exit(2);
}
const options = JSON.parse(optionsJson ?? '{}');
const texts = options.texts ?? ['the cat sat on the mat', 'a dog ran'];
const generate = { do_sample: false, num_beams: 1, ...(options.generate ?? {}) };

const tjsDir = process.env.OPREG_TJS_DIR;
const require = createRequire(path.join(path.resolve(tjsDir), 'package.json'));
const { pipeline, env } = require('@huggingface/transformers');

const dir = path.resolve(folder);
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(dir) + '/';
env.useFSCache = false;

const pipe = await pipeline('text2text-generation', path.basename(dir), {
    local_files_only: true, dtype: 'fp32', device: 'cpu', subfolder: '',
});
const inputs = pipe.tokenizer(texts, { padding: true, truncation: true });
const ids = await pipe.model.generate({ ...inputs, ...generate });
const generated = await pipe(texts, generate);
console.log(JSON.stringify({
    tokens: ids.tolist().map((row) => row.map(Number)),
    input_ids: inputs.input_ids.tolist().map((row) => row.map(Number)),
    texts: generated.map((g) => g.generated_text),
    versions: { transformers_js: env.version, onnxruntime: env.backends?.onnx?.versions?.node ?? null, node: process.version },
}));
