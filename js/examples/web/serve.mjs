// A static server for the demo page on loopback: node examples/web/serve.mjs --bundle DIR
// [--port N] serves this folder at / and the bundle folder at /bundle/. It sends the
// cross-origin isolation headers, so onnxruntime-web may use wasm threads. Prints its URL.
import { createReadStream, promises as fs } from "node:fs";
import { createServer } from "node:http";
import { dirname, extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const bundle = option("bundle", null);
if (!bundle) {
  console.error("usage: node examples/web/serve.mjs --bundle BUNDLE_DIR [--port 8000] (a bundle made by `edgespec export`)");
  process.exit(2);
}
if (!(await fs.stat(join(bundle, "manifest.json")).catch(() => null))) {
  console.error(`${bundle} is not an edgespec bundle (no manifest.json): make one with \`edgespec export MODEL --out DIR\``);
  process.exit(2);
}
const roots = { "/bundle/": resolve(bundle), "/": dirname(fileURLToPath(import.meta.url)) };
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
  ".json": "application/json", ".jinja": "text/plain", ".onnx": "application/octet-stream", ".bin": "application/octet-stream" };

const server = createServer(async (req, res) => {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  const prefix = path.startsWith("/bundle/") ? "/bundle/" : "/";
  const root = roots[prefix];
  let file = normalize(join(root, path.slice(prefix.length) || "index.html"));
  if (file !== root && !file.startsWith(root + sep)) {
    res.writeHead(403).end();
    return;
  }
  const stat = await fs.stat(file).catch(() => null);
  if (stat?.isDirectory()) file = join(file, "index.html");
  if (!stat || !(await fs.stat(file).catch(() => null))?.isFile()) {
    res.writeHead(404, { "content-type": "text/plain" }).end(`not found: ${path}\n`);
    return;
  }
  res.writeHead(200, {
    "content-type": TYPES[extname(file)] ?? "application/octet-stream",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cache-control": "no-store",
  });
  if (req.method === "HEAD") res.end();
  else createReadStream(file).pipe(res);
});
server.listen(Number(option("port", "8000")), "127.0.0.1", () => {
  console.log(`serving http://127.0.0.1:${server.address().port}/ (bundle ${bundle} at /bundle/)`);
});
