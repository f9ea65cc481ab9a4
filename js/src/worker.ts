/** The thread a `ThreadedModel` runs its model in (`threaded.ts`): onnxruntime-node's `run`
is synchronous under a `setImmediate` wrapper (1.30), so a step run on the app's thread holds its
event loop for the whole step; here it holds only this thread's.

Takes `{ type: "load", dir, options }` once, then calls `{ type: "stream" | "chat", id, abort,
... }`; answers `loaded`, `progress`, one `chunk` per round of a stream, then `done` (with a
chat's reply) or `error` ({ name, message }) per call. `abort` is a shared Int32 the app's
thread sets when the call's AbortSignal fires: the decode loop reads it before each round, with
no message to wait for, so the round in flight is the last one. */

import { parentPort } from "node:worker_threads";
import { loadModel, type Model } from "./model.js";
import { folderFiles } from "./folder.js";
import type { Ort } from "./graph.js";

type Request =
  | { type: "load"; dir: string; options: Record<string, unknown> }
  | { type: "stream"; id: number; abort: SharedArrayBuffer; ids: number[]; options: Record<string, unknown> }
  | { type: "chat"; id: number; abort: SharedArrayBuffer; messages: unknown[]; options: Record<string, unknown> };

const port = parentPort!;
let model: Model | null = null;

function failure(e: unknown): { name: string; message: string } {
  const error = e instanceof Error ? e : new Error(String(e));
  return { name: error.name, message: error.message };
}

async function serve(r: Request): Promise<void> {
  if (r.type === "load") {
    try {
      const ort = (await import("onnxruntime-node")) as unknown as Ort;
      const onProgress = (message: string) => port.postMessage({ type: "progress", message });
      model = await loadModel(folderFiles(r.dir), ort, { ...r.options, onProgress });
      port.postMessage({ type: "loaded" });
    } catch (e) {
      port.postMessage({ type: "error", id: 0, error: failure(e) });
    }
    return;
  }
  // the decode loop reads only `signal.aborted`
  const flag = new Int32Array(r.abort);
  const signal = { get aborted() { return Atomics.load(flag, 0) !== 0; } } as AbortSignal;
  try {
    const options = { ...r.options, signal };
    if (r.type === "stream") {
      for await (const chunk of model!.stream(r.ids, options)) port.postMessage({ type: "chunk", id: r.id, chunk });
      port.postMessage({ type: "done", id: r.id });
    } else {
      const reply = await model!.chat(r.messages as never, options);
      port.postMessage({ type: "done", id: r.id, result: { ...reply, stats: { ...reply.stats } } });
    }
  } catch (e) {
    port.postMessage({ type: "error", id: r.id, error: failure(e) });
  }
}

port.on("message", (r: Request) => void serve(r));
