/** edgespec: edgespec bundles and speculative decoding over onnxruntime-common.

Platform-neutral: pass the onnxruntime module of your platform (onnxruntime-web,
onnxruntime-react-native) and a `BundleFiles` reader to `loadModel`. In Node,
`import { load } from "edgespec"` reads a bundle folder with onnxruntime-node. */

export { loadModel, Model, MODES } from "./model.js";
export type { ChatOptions, ChatReply, Chunk, Generation, GenerateOptions, LoadOptions, Mode, Prompt } from "./model.js";
export { loadManifest } from "./bundle.js";
export type { Manifest, ModelInfo, GraphInfo } from "./bundle.js";
export { ChatTemplate, ChatTemplateError } from "./chat.js";
export type { Message, RenderOptions } from "./chat.js";
export { Tokenizer } from "./tokenizer.js";
export { AbortError, BundleError, EdgespecError, InputError } from "./errors.js";
export { LinkError, RemoteVerifier, SplitError } from "./remote.js";
export { FallbackVerifier } from "./fallback.js";
export type { SplitOptions, WebSocketClass } from "./remote.js";
export { ProtocolError } from "./protocol.js";
export type { BundleFiles } from "./files.js";
export type { KVOutputs, Ort } from "./graph.js";
export { GenerationStats } from "./round.js";
export type { RoundStats } from "./round.js";
