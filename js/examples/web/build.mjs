// npm run build:web: the demo page's script (the package, onnxruntime-web, the tokenizer and
// template packages) as one ES module in examples/web/dist/app.js, with onnxruntime-web's wasm
// files beside it.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "dist");
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "app.mjs")],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  outfile: join(out, "app.js"),
  logLevel: "warning",
});
// the default onnxruntime-web build runs wasm and WebGPU from one wasm binary (JSEP)
const ortDist = join(here, "..", "..", "node_modules", "onnxruntime-web", "dist");
for (const name of ["ort-wasm-simd-threaded.jsep.wasm", "ort-wasm-simd-threaded.jsep.mjs"]) {
  copyFileSync(join(ortDist, name), join(out, name));
}
