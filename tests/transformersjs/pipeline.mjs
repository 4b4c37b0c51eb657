// A transformers.js pipeline on a folder `opreg export` wrote (optimum's flat layout: model.onnx, or
// encoder_model.onnx and decoder_model_merged.onnx, beside config.json and the tokenizer's files,
// loaded unchanged with `subfolder: ''`), offline.
//
// usage: node pipeline.mjs FOLDER '{"task": "...", "texts": ["..."], "generate": {...}}'
// prints one JSON line, by task:
//   feature-extraction:  {input_ids, hidden: [[[...]]] (pooling none, one text at a time), pooled (mean, normalized)}
//   text-classification: {input_ids, scores: [[{label, score}, ...], ...] (every label, top_k null)}
//   text-generation:     {input_ids, tokens: generate's ids (prompt first), texts: the pipeline's}
//                        (each text alone: a decoder-only batch would be padded on the left)
//   text2text-generation: {input_ids, tokens: generate's ids for the texts padded together (the
//                        decoder's start token first), texts: the pipeline's}
// and versions. transformers.js is resolved from OPREG_TJS_DIR (a folder whose node_modules holds
// @huggingface/transformers), which the suite sets (tests/transformersjs_runtime.py).
import { createRequire } from 'node:module';
import path from 'node:path';

const [folder, optionsJson] = process.argv.slice(2);
const options = JSON.parse(optionsJson ?? '{}');
const texts = options.texts ?? ['the cat sat on the mat', 'a dog ran'];
const require = createRequire(path.join(path.resolve(process.env.OPREG_TJS_DIR), 'package.json'));
const { pipeline, env } = require('@huggingface/transformers');

const dir = path.resolve(folder);
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(dir) + '/';
env.useFSCache = false;
const pipe = await pipeline(options.task, path.basename(dir), {
    local_files_only: true, dtype: 'fp32', device: 'cpu', subfolder: '',
});
const ids = (t) => t.tolist().map((row) => row.map(Number));
const inputs = pipe.tokenizer(texts, { padding: true, truncation: true });
const answer = { input_ids: ids(inputs.input_ids) };
if (options.task === 'feature-extraction') {
    answer.hidden = [];
    for (const text of texts) answer.hidden.push((await pipe(text)).tolist()[0]);
    answer.pooled = (await pipe(texts, { pooling: 'mean', normalize: true })).tolist();
} else if (options.task === 'text-classification') {
    answer.scores = [];
    for (const text of texts) answer.scores.push(await pipe(text, { top_k: null }));
} else if (options.task === 'text-generation') {
    const generate = { do_sample: false, num_beams: 1, ...(options.generate ?? {}) };
    answer.tokens = [];
    answer.texts = [];
    for (const text of texts) {  // one prompt at a time: no padding for the decoder to mask
        answer.tokens.push(ids(await pipe.model.generate({ ...pipe.tokenizer(text), ...generate }))[0]);
        answer.texts.push((await pipe(text, generate))[0].generated_text);
    }
} else if (options.task === 'text2text-generation') {
    const generate = { do_sample: false, num_beams: 1, ...(options.generate ?? {}) };
    answer.tokens = ids(await pipe.model.generate({ ...inputs, ...generate }));
    answer.texts = (await pipe(texts, generate)).map((g) => g.generated_text);
} else {
    console.error(`pipeline.mjs does not run task ${options.task}`);
    process.exit(2);
}
answer.versions = { transformers_js: env.version, onnxruntime: env.backends?.onnx?.versions?.node ?? null, node: process.version };
console.log(JSON.stringify(answer));
