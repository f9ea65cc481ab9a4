/** A bundle folder on the phone's file system (the app downloads or unpacks it there, e.g.
into its documents directory): text and bytes read with React Native's fetch of file:// URLs,
graphs opened by onnxruntime-react-native from their path, so its native loader finds the
weights file beside them. */

import type { BundleFiles } from "edgespec/core";

export function deviceFiles(dir: string): BundleFiles {
  const root = dir.replace(/\/$/, "");
  const url = (name: string) => `file://${root}/${name}`;
  const get = async (name: string): Promise<Response> => {
    const response = await fetch(url(name));
    if (!response.ok) throw new Error(`${root}/${name} cannot be read (${response.status}): copy the whole bundle folder there`);
    return response;
  };
  return {
    where: root,
    exists: async (name) => fetch(url(name)).then((r) => r.ok, () => false),
    readText: async (name) => (await get(name)).text(),
    readBytes: async (name) => new Uint8Array(await (await get(name)).arrayBuffer()),
    path: (name) => `${root}/${name}`,
  };
}
