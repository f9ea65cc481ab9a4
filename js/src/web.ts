/** Browsers: bundles fetched from a URL, graphs run by onnxruntime-web (wasm, or WebGPU
where the browser offers an adapter).

`loadFromUrl(url, ort, options)` takes the app's `onnxruntime-web` module (so the app decides
where its wasm files are served from, `ort.env.wasm.wasmPaths`) and a bundle folder served over
HTTP. `pickBackend(ort)` says which execution provider this browser can run: `webgpu` when
`navigator.gpu` gives an adapter, else `wasm`, with the reason in `note` for the page to show.
onnxruntime-web loads graphs from bytes: the bundle's weights file is fetched once and handed to
every graph as its external data. */

import { BundleError } from "./errors.js";
import type { BundleFiles } from "./files.js";
import type { Ort } from "./graph.js";
import { loadModel, type LoadOptions, type Model } from "./model.js";

export * from "./index.js";

/** A bundle folder served over HTTP (`base` ends with or without a slash). */
export function urlFiles(base: string, fetchImpl: typeof fetch = fetch): BundleFiles {
  const root = base.endsWith("/") ? base : `${base}/`;
  const get = async (name: string): Promise<Response> => {
    let response: Response;
    try {
      response = await fetchImpl(root + name);
    } catch (e) {
      throw new BundleError(`cannot fetch ${root + name}: ${(e as Error).message}; is the bundle served there?`);
    }
    if (!response.ok) {
      throw new BundleError(`${root + name} answered ${response.status}: serve the bundle folder made by \`edgespec export\` at ${root}`);
    }
    return response;
  };
  return {
    where: root.slice(0, -1),
    exists: async (name) => {
      try {
        const r = await fetchImpl(root + name, { method: "HEAD" });
        return r.ok;
      } catch {
        return false;
      }
    },
    readText: async (name) => (await get(name)).text(),
    readBytes: async (name) => new Uint8Array(await (await get(name)).arrayBuffer()),
  };
}

export interface Backend {
  /** The execution provider the graphs run on. */
  provider: "webgpu" | "wasm";
  /** Why this one (shown by the demo page): a WebGPU adapter's name, or why not WebGPU. */
  note: string;
}

/** WebGPU when this browser gives an adapter, else wasm with the reason. */
export async function pickBackend(): Promise<Backend> {
  const gpu = (globalThis.navigator as { gpu?: { requestAdapter(): Promise<unknown> } } | undefined)?.gpu;
  if (!gpu) return { provider: "wasm", note: "WebGPU is not offered by this browser (no navigator.gpu): running on wasm" };
  type Adapter = { info?: { vendor?: string; architecture?: string; description?: string } } | null;
  let adapter: Adapter;
  try {
    adapter = (await gpu.requestAdapter()) as Adapter;
  } catch (e) {
    return { provider: "wasm", note: `WebGPU's requestAdapter() failed (${(e as Error).message}): running on wasm` };
  }
  if (adapter === null) return { provider: "wasm", note: "WebGPU gave no adapter (no usable GPU): running on wasm" };
  const info = adapter.info ?? {};
  const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "unnamed adapter";
  return { provider: "webgpu", note: `WebGPU adapter: ${name}` };
}

export interface WebLoadOptions extends LoadOptions {
  /** The execution provider; default: what `pickBackend()` finds. */
  provider?: "webgpu" | "wasm";
}

/** `const model = await loadFromUrl("/bundle/", ort, { mode: "spec" })`. */
export async function loadFromUrl(url: string, ort: Ort, options: WebLoadOptions = {}): Promise<Model> {
  const provider = options.provider ?? (await pickBackend()).provider;
  const { provider: _, ...rest } = options;
  return loadModel(urlFiles(url), ort, {
    ...rest,
    kvOutputs: provider === "webgpu" ? "concatenated" : "returned",
    sessionOptions: { executionProviders: [provider], ...options.sessionOptions },
  });
}
