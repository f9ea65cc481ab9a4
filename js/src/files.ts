/** How a bundle's files are read: the one platform-specific part of loading a bundle.

Node reads the folder (`edgespec/node`); a browser or React Native app passes its own reader
(fetch, the app's assets). A graph is opened from its path where the onnxruntime binding
reads files itself (Node: external weights beside it), else from bytes. */

export interface BundleFiles {
  /** A human-readable name of the bundle (its folder or URL), for messages. */
  readonly where: string;
  exists(name: string): Promise<boolean>;
  readText(name: string): Promise<string>;
  readBytes(name: string): Promise<Uint8Array>;
  /** A path onnxruntime can open directly (external data resolved beside it), if any. */
  path?(name: string): string;
}
