// Runs one model folder written by `opreg export` in transformers.js (onnxruntime-node), as its
// model classes load it: `node bench/tjs_media.mjs TJS_DIR FOLDER CLASS INPUTS.json` prints the
// outputs as JSON; `node bench/tjs_media.mjs TJS_DIR FOLDER pipeline:TASK IMAGE.png` runs the
// task's pipeline on an image. bench/tjs_media.py drives it. TJS_DIR holds
// node_modules/@huggingface/transformers (bench/tjs_media.py installs it under build/ when absent).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [tjsDir, folder, what, file] = process.argv.slice(2);
const entry = path.join(tjsDir, 'node_modules/@huggingface/transformers/dist/transformers.node.mjs');
const T = await import(pathToFileURL(entry).href);
T.env.allowRemoteModels = false;
T.env.localModelPath = path.dirname(path.resolve(folder)) + '/';
T.env.useFSCache = false;
const id = path.basename(folder);
const options = { subfolder: '', model_file_name: 'model', dtype: 'fp32', device: 'cpu', local_files_only: true };

function plain(value) {
    if (value?.dims) return { dims: value.dims, data: Array.from(value.data, Number) };
    if (Array.isArray(value)) return value.map(plain);
    if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
    return value;
}

let result;
if (what.startsWith('pipeline:')) {
    const run = await T.pipeline(what.slice('pipeline:'.length), id, options);
    result = await run(await T.RawImage.read(file), { top_k: null });
} else {
    const model = await T[what].from_pretrained(id, options);
    const feeds = {};
    for (const [name, { dtype, dims, data }] of Object.entries(JSON.parse(fs.readFileSync(file, 'utf8')))) {
        const values = dtype === 'int64' ? BigInt64Array.from(data.map(BigInt)) : Float32Array.from(data);
        feeds[name] = new T.Tensor(dtype, values, dims);
    }
    result = await model(feeds);
}
console.log(JSON.stringify(plain(result)));
