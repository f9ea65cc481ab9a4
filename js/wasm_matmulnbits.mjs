// Runs one-input graphs on onnxruntime-web's wasm backend in Node
// (tests/test_js_wasm_matmulnbits.py): node wasm_matmulnbits.mjs CASES.json OUT.json.
// CASES.json: [{model, input, dims}] (`input` a file of float32 values, fed as "A"); OUT.json:
// per case the output "Y" as float32 bytes in base64.
import { readFileSync, writeFileSync } from "node:fs";
import * as ort from "onnxruntime-web";

ort.env.wasm.numThreads = 1;
const [casesPath, outPath] = process.argv.slice(2);
const out = [];
for (const c of JSON.parse(readFileSync(casesPath, "utf-8"))) {
  const data = new Float32Array(new Uint8Array(readFileSync(c.input)).buffer);
  const session = await ort.InferenceSession.create(new Uint8Array(readFileSync(c.model)), { executionProviders: ["wasm"], logSeverityLevel: 3 });
  const { Y } = await session.run({ A: new ort.Tensor("float32", data, c.dims) });
  out.push(Buffer.from(Y.data.buffer, Y.data.byteOffset, Y.data.byteLength).toString("base64"));
  await session.release();
}
writeFileSync(outPath, JSON.stringify(out));
