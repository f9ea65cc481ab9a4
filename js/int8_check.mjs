// Runs one-input graphs on onnxruntime-web's wasm backend in Node, as they are and with
// `int8Activations` (src/int8_activations.ts) applied (tests/test_js_int8_activations.py):
// node int8_check.mjs CASES.json OUT.json. CASES.json: [{model, input, dims}] (`input` a file
// of float32 values, fed as "A"); OUT.json: per case the output "Y" as float32 bytes in
// base64, "plain" (the graph as it is) and "edited".
import { readFileSync, writeFileSync } from "node:fs";
import * as ort from "onnxruntime-web";
import { int8Activations } from "./dist/int8_activations.js";

ort.env.wasm.numThreads = 1;
const [casesPath, outPath] = process.argv.slice(2);
const base64 = (t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).toString("base64");
const out = [];
for (const c of JSON.parse(readFileSync(casesPath, "utf-8"))) {
  const bytes = new Uint8Array(readFileSync(c.model));
  const data = new Float32Array(new Uint8Array(readFileSync(c.input)).buffer);
  const row = {};
  for (const [name, graph] of [["plain", bytes], ["edited", int8Activations(bytes, c.model)]]) {
    const session = await ort.InferenceSession.create(graph, { executionProviders: ["wasm"], logSeverityLevel: 3 });
    const { Y } = await session.run({ A: new ort.Tensor("float32", data, c.dims) });
    row[name] = base64(Y);
    await session.release();
  }
  out.push(row);
}
writeFileSync(outPath, JSON.stringify(out));
