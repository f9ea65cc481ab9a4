/** Node (and Electron): bundles read from a folder, graphs run by onnxruntime-node.

`load(dir, options)` runs the model in a worker thread by default (`ThreadedModel`: the app's
event loop stays free while a step computes; onnxruntime-node 1.30's `run` blocks the thread it
runs on); `thread: "main"` runs it here (`Model`), as split mode always does (its WebSocket and
the server link live on this thread). Both answer `generate`, `stream`, `chat`, `encode` and
`renderChat` alike. */

import { promises as fs } from "node:fs";
import { BundleError, InputError } from "./errors.js";
import { folderFiles } from "./folder.js";
import type { Ort } from "./graph.js";
import { loadModel, type LoadOptions, type Model } from "./model.js";
import { ThreadedModel } from "./threaded.js";

export * from "./index.js";
export { folderFiles } from "./folder.js";
export { ThreadedModel } from "./threaded.js";

export interface NodeLoadOptions extends LoadOptions {
  /** "worker" (the default but in split mode): the graphs run in a worker thread;
   * "main": on this thread. */
  thread?: "worker" | "main";
}

/** `const model = await load(dir, { mode: "spec" })`. */
export async function load(dir: string, options: NodeLoadOptions = {}): Promise<Model | ThreadedModel> {
  const stat = await fs.stat(dir).catch(() => null);
  if (!stat) throw new BundleError(`bundle folder ${dir} does not exist; create one with \`edgespec export\``);
  if (!stat.isDirectory()) throw new BundleError(`${dir} is a file, not a bundle folder made by \`edgespec export\``);
  const { thread, ...rest } = options;
  if (thread !== undefined && thread !== "worker" && thread !== "main") {
    throw new InputError(`thread '${thread}' is not one of: worker, main`);
  }
  let ort: Ort;
  try {
    ort = (await import("onnxruntime-node")) as unknown as Ort;
  } catch {
    throw new BundleError("onnxruntime-node is not installed: `npm install onnxruntime-node`");
  }
  const files = folderFiles(dir);
  if ((thread ?? "worker") === "worker" && rest.mode !== "split") return ThreadedModel.open(dir, files, rest);
  return loadModel(files, ort, rest);
}
