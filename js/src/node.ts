/** Node (and Electron): bundles read from a folder, graphs run by onnxruntime-node. */

import { promises as fs } from "node:fs";
import path from "node:path";
import { BundleError } from "./errors.js";
import type { BundleFiles } from "./files.js";
import type { Ort } from "./graph.js";
import { loadModel, type LoadOptions, type Model } from "./model.js";

export * from "./index.js";

export function folderFiles(dir: string): BundleFiles {
  const root = path.resolve(dir);
  return {
    where: dir,
    exists: async (name) => fs.access(path.join(root, name)).then(() => true, () => false),
    readText: (name) => fs.readFile(path.join(root, name), "utf-8"),
    readBytes: async (name) => new Uint8Array(await fs.readFile(path.join(root, name))),
    path: (name) => path.join(root, name),
  };
}

/** `const model = await load(dir, { mode: "spec" })`. */
export async function load(dir: string, options: LoadOptions = {}): Promise<Model> {
  const stat = await fs.stat(dir).catch(() => null);
  if (!stat) throw new BundleError(`bundle folder ${dir} does not exist; create one with \`edgespec export\``);
  if (!stat.isDirectory()) throw new BundleError(`${dir} is a file, not a bundle folder made by \`edgespec export\``);
  let ort: Ort;
  try {
    ort = (await import("onnxruntime-node")) as unknown as Ort;
  } catch {
    throw new BundleError("onnxruntime-node is not installed: `npm install onnxruntime-node`");
  }
  return loadModel(folderFiles(dir), ort, options);
}
