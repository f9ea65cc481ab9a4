/** A bundle folder on disk as `BundleFiles` (Node: the app's thread and the model's thread). */

import { promises as fs } from "node:fs";
import path from "node:path";
import type { BundleFiles } from "./files.js";

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
