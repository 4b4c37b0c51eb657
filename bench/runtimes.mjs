// Runs models in onnxruntime-node (the copy transformers.js installs) for bench/runtimes.py:
// `node bench/runtimes.mjs TJS_DIR CASES_JSON` where CASES_JSON is [[model, feeds.json, expected.json, rtol, atol], ...];
// feeds and expected are {name: {dtype, dims, data}} (expected by output position: o0, o1, ...). Prints a JSON row per
// model: loaded, ran, matches, max_abs, error.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [tjsDir, casesJson] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(tjsDir), 'package.json'));
const ort = require('onnxruntime-node');
const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, float64: Float64Array };

function tensor(value) {
    const Array_ = ARRAYS[value.dtype];
    const data = value.dtype === 'int64' ? BigInt64Array.from(value.data.map(BigInt)) : Array_.from(value.data);
    return new ort.Tensor(value.dtype, data, value.dims);
}

const rows = [];
for (const [model, feedsFile, expectedFile, rtol, atol] of JSON.parse(casesJson)) {
    const row = { model, version: ort.env.versions?.common ?? '' };
    let session;
    try {
        session = await ort.InferenceSession.create(model, { executionProviders: ['cpu'] });
    } catch (e) {
        rows.push({ ...row, loaded: false, error: String(e.message ?? e).trim().split('\n')[0].slice(-300) });
        continue;
    }
    row.loaded = true;
    const feeds = JSON.parse(fs.readFileSync(feedsFile, 'utf8'));
    const expected = JSON.parse(fs.readFileSync(expectedFile, 'utf8'));
    try {
        const inputs = Object.fromEntries(session.inputNames.map((name) => [name, tensor(feeds[name])]));
        const outputs = await session.run(inputs);
        let worst = 0, matches = true;
        session.outputNames.forEach((name, i) => {
            const want = expected[`o${i}`].data, got = Array.from(outputs[name].data, Number);
            if (got.length !== want.length) matches = false;
            got.forEach((g, j) => {
                const d = Math.abs(g - Number(want[j]));
                worst = Math.max(worst, d);
                if (!(d <= atol + rtol * Math.abs(Number(want[j])))) matches = false;
            });
        });
        rows.push({ ...row, ran: true, matches, max_abs: worst });
    } catch (e) {
        rows.push({ ...row, ran: false, error: String(e.message ?? e).trim().split('\n')[0].slice(-300) });
    }
    await session.release();
}
console.log(JSON.stringify(rows));
