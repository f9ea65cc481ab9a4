// The demo page: loads a bundle with onnxruntime-web (WebGPU where the browser gives an
// adapter, else wasm), generates with `ar` and then with the chosen speculative mode, shows
// the tokens as they stream and the speed-up. Query parameters preset the form and `run=1`
// starts it; the result is left in `window.edgespecResult` (tests/test_js_browser.py reads it).
import * as ort from "onnxruntime-web";
import { loadFromUrl, pickBackend } from "../../dist/web.js";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
for (const key of ["bundle", "mode", "policy", "max", "prompt", "server"]) if (query.has(key)) $(key).value = query.get(key);
// the wasm files sit beside this script (npm run build:web copies them)
ort.env.wasm.wasmPaths = new URL("./", import.meta.url).href;
if (query.has("threads")) ort.env.wasm.numThreads = Number(query.get("threads"));

let backend = query.get("provider") ? { provider: query.get("provider"), note: `asked for ${query.get("provider")}` } : await pickBackend();
const showBackend = () => {
  $("backend").textContent = `${backend.note} (onnxruntime-web ${ort.env.versions.web}, ${ort.env.wasm.numThreads ?? "default"} wasm threads)`;
};
showBackend();

async function run(mode, policy, prompt, maxNewTokens, out) {
  out.textContent = "";
  const model = await loadFromUrl($("bundle").value, ort, {
    mode, draftPolicy: mode === "ar" ? undefined : policy, provider: backend.provider,
    // eagle: "eagle" (the feature head alone) or "lookup+eagle" (prompt lookup first)
    drafter: mode === "eagle" ? query.get("drafter") || undefined : undefined,
    // split: the page drafts, `edgespec serve` at this address verifies (no token: a browser
    // cannot send one)
    split: mode === "split" ? { server: $("server").value } : undefined,
    onProgress: (line) => ($("status").textContent = line),
  });
  $("status").textContent = `generating (${mode})`;
  const tokens = [], chunks = [];
  let decodeSeconds = 0, decodeTokens = 0, rounds = 0, finishReason = null;
  for await (const chunk of model.stream(prompt, { maxNewTokens, ignoreEos: query.get("ignoreEos") === "1" })) {
    out.textContent += chunk.text;
    tokens.push(...chunk.tokens);
    chunks.push(chunk.tokens.length);
    if (chunk.stats.kind !== "prefill") {
      decodeSeconds += chunk.stats.seconds;
      decodeTokens += chunk.tokens.length;
      rounds += 1;
    }
    finishReason = chunk.finishReason ?? finishReason;
    await new Promise((r) => setTimeout(r, 0)); // let the page paint each chunk
  }
  model.verifier.disconnect?.();
  return { mode, policy: mode === "ar" ? null : policy, tokens, text: out.textContent, chunks, finishReason,
    tokensPerSecond: decodeTokens / decodeSeconds, tokensPerRound: decodeTokens / rounds };
}

function row(r, base) {
  const tr = document.createElement("tr");
  const speedup = base ? `${(r.tokensPerSecond / base.tokensPerSecond).toFixed(2)}x` : "1.00x";
  for (const cell of [r.policy ? `${r.mode} ${r.policy}` : r.mode, r.tokens.length, r.chunks.length,
    r.tokensPerSecond.toFixed(1), r.tokensPerRound.toFixed(2), speedup]) {
    const td = document.createElement("td");
    td.textContent = cell;
    tr.append(td);
  }
  $("stats").append(tr);
}

async function generate() {
  $("go").disabled = true;
  const mode = $("mode").value, policy = $("policy").value || "auto";
  const prompt = $("prompt").value, max = Number($("max").value);
  $("mode-title").textContent = `${mode} ${mode === "ar" ? "" : policy}`;
  try {
    let ar;
    try {
      ar = await run("ar", null, prompt, max, $("out-ar"));
    } catch (e) {
      if (backend.provider !== "webgpu" || query.get("provider")) throw e;
      // a kernel onnxruntime-web's WebGPU backend cannot run on this bundle: wasm runs them all
      backend = { provider: "wasm", webgpuError: e.message,
        note: `${backend.note}, but onnxruntime-web's WebGPU kernels failed on this bundle (${e.message}): running on wasm` };
      showBackend();
      ar = await run("ar", null, prompt, max, $("out-ar"));
    }
    row(ar, null);
    const other = await run(mode, policy, prompt, max, $("out-mode"));
    row(other, ar);
    $("status").textContent = other.tokens.join() === ar.tokens.join() ? "done: the same tokens as ar" : "done: the tokens DIFFER from ar";
    window.edgespecResult = { backend, runs: [ar, other] };
  } catch (e) {
    $("status").textContent = `error: ${e.message}`;
    window.edgespecResult = { backend, error: `${e.name}: ${e.message}` };
  } finally {
    $("go").disabled = false;
  }
}

$("go").addEventListener("click", generate);
if (query.get("run") === "1") generate();
