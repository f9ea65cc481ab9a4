/** The edgespec bundle manifest (`edgespec/bundle.py`): read and checked before any graph opens.

`loadManifest` guarantees what it returns was checked against the schema (format, version,
required keys, graph roles, files present); every problem is a `BundleError` naming the file,
what is wrong and what to do. */

import { BundleError } from "./errors.js";
import type { BundleFiles } from "./files.js";

export const SCHEMA_VERSION = 1;
export const MANIFEST = "manifest.json";
const FORMAT = "edgespec-bundle";
const ROLE = /^(full|draft|eagle|head@(\d+)|tail@(\d+))$/;
/** The output a target graph declares its feature layers' states in (what `eagle` reads). */
export const FEATURES = "features";

export interface TensorSpec {
  name: string;
  dtype: string; // "float32" | "float16" | "int64" | "int32"
  shape: (number | string)[];
}

export interface ModelInfo {
  architecture: string;
  model_type: string;
  num_layers: number;
  hidden_size: number;
  num_heads: number;
  num_kv_heads: number;
  head_dim: number;
  vocab_size: number;
  max_position_embeddings: number;
  tie_word_embeddings: boolean;
}

export interface GraphInfo {
  role: string; // full | draft | eagle | head@k | tail@k
  file: string;
  model: "target" | "draft";
  kv_layers: number[];
  inputs: TensorSpec[];
  outputs: TensorSpec[];
}

export interface ChatFormat {
  templates: Record<string, string>; // name -> jinja file in the bundle
  special_tokens: Record<string, string>;
  generation: Record<string, unknown>;
}

export interface Manifest {
  source: Record<string, unknown>;
  target: ModelInfo;
  dtype: string;
  quantization: string | null;
  tokenizer_files: string[];
  bos_token_id: number | null;
  eos_token_ids: number[];
  weights_file: string;
  graphs: GraphInfo[];
  draft: ModelInfo | null;
  schema_version: number;
  variant: string;
  backbone_fingerprint: string; // what a split server checks its target against ("" if none)
  chat: ChatFormat | null;
  /** The layers whose residual streams `full` outputs as `features` (what the `eagle` graph,
   * a feature head made by `edgespec distill`, drafts from); [] none. */
  feature_layers: number[];
  /** What the exporters recorded beside the schema (`extra.eagle`: the head's distill record). */
  extra: Record<string, unknown>;
  /** Every target call runs a multiple of this many positions (`runtime/graphs/stack.py`):
   * 2 where a lone row takes another kernel path than a wide call's rows. */
  step_width: number;
}

export function exitLayer(graph: GraphInfo): number | null {
  const m = ROLE.exec(graph.role);
  return m && (m[2] ?? m[3]) ? Number(m[2] ?? m[3]) : null;
}

export function findGraph(manifest: Manifest, role: string): GraphInfo {
  const g = manifest.graphs.find((x) => x.role === role);
  if (!g) {
    const roles = manifest.graphs.map((x) => x.role).join(", ");
    throw new BundleError(`this bundle has no '${role}' graph (it has: ${roles}); ${howToAdd(role)}`);
  }
  return g;
}

export function exitLayers(manifest: Manifest): number[] {
  const ks = manifest.graphs.filter((g) => g.role.startsWith("head@")).map((g) => exitLayer(g)!);
  return [...new Set(ks)].sort((a, b) => a - b);
}

export function modelInfo(manifest: Manifest, graph: GraphInfo): ModelInfo {
  if (graph.model === "draft") {
    if (!manifest.draft) throw new BundleError("manifest lists a draft graph but no draft model info");
    return manifest.draft;
  }
  return manifest.target;
}

function howToAdd(role: string): string {
  if (role === "eagle") return "add a feature head with `edgespec distill MODEL --out FOLDER`.";
  if (role === "draft") return "re-export with `edgespec export MODEL --draft DRAFT_MODEL`.";
  if (role.startsWith("head@") || role.startsWith("tail@")) {
    return `re-export with \`edgespec export MODEL --exit-layers ${role.split("@")[1]}\`.`;
  }
  return "re-export the bundle with `edgespec export`.";
}

export async function loadManifest(files: BundleFiles): Promise<Manifest> {
  const where = files.where;
  if (!(await files.exists(MANIFEST))) {
    throw new BundleError(
      `${where} has no ${MANIFEST}: it is not an edgespec bundle ` +
        "(make one with `edgespec export MODEL --out FOLDER`)",
    );
  }
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(await files.readText(MANIFEST));
  } catch (e) {
    throw new BundleError(`${where}/${MANIFEST} is not valid JSON (${(e as Error).message}); re-export the bundle`);
  }
  if (typeof raw !== "object" || raw === null || raw.format !== FORMAT) {
    throw new BundleError(`${where}/${MANIFEST} is not an edgespec manifest (no "format": "${FORMAT}")`);
  }
  const version = raw.schema_version;
  if (typeof version !== "number" || !Number.isInteger(version) || version < 1) {
    throw new BundleError(`${where}/${MANIFEST} has no valid schema_version; re-export the bundle`);
  }
  if (version > SCHEMA_VERSION) {
    throw new BundleError(
      `${where}/${MANIFEST} uses bundle schema ${version}, newer than this edgespec understands ` +
        `(${SCHEMA_VERSION}); upgrade the edgespec package or re-export the bundle with this version`,
    );
  }
  let manifest: Manifest;
  try {
    manifest = fromJson(raw);
  } catch (e) {
    throw new BundleError(`${where}/${MANIFEST} is malformed (${(e as Error).message}); re-export the bundle`);
  }
  const needed = [
    manifest.weights_file,
    ...manifest.tokenizer_files,
    ...manifest.graphs.map((g) => g.file),
    ...(manifest.chat ? Object.values(manifest.chat.templates) : []),
  ];
  const missing: string[] = [];
  for (const f of needed) if (!(await files.exists(f))) missing.push(f);
  if (missing.length) {
    throw new BundleError(
      `bundle ${where} is incomplete: missing ${missing.join(", ")}; copy the whole folder again or re-export it`,
    );
  }
  return manifest;
}

function need<T>(raw: Record<string, unknown>, key: string): T {
  if (!(key in raw)) throw new Error(`missing key '${key}'`);
  return raw[key] as T;
}

function fromJson(raw: Record<string, unknown>): Manifest {
  const graphs = need<GraphInfo[]>(raw, "graphs");
  if (!Array.isArray(graphs)) throw new Error("'graphs' is not a list");
  for (const g of graphs) {
    if (!ROLE.test(g.role)) throw new Error(`unknown graph role '${g.role}'`);
    for (const key of ["file", "model", "kv_layers", "inputs", "outputs"]) need(g as never, key);
  }
  const variant = (raw.variant as string | undefined) ?? "standard";
  if (variant === "standard" && !graphs.some((g) => g.role === "full" || g.role.startsWith("tail@"))) {
    throw new Error("no 'full' or 'tail@k' graph: nothing can verify");
  }
  const featureLayers = ((raw.feature_layers as number[] | undefined) ?? []).map(Number);
  const full = graphs.find((g) => g.role === "full");
  if (featureLayers.length && !full?.outputs.some((t) => t.name === FEATURES)) {
    throw new Error("feature_layers are declared but the full graph outputs no features");
  }
  if (graphs.some((g) => g.role === "eagle") && !featureLayers.length) {
    throw new Error("an eagle graph needs the target's feature_layers");
  }
  const chat = raw.chat as ChatFormat | null | undefined;
  if (chat && !Object.keys(chat.templates ?? {}).length) throw new Error("chat.templates is empty");
  return {
    source: need(raw, "source"),
    target: need(raw, "target"),
    dtype: need(raw, "dtype"),
    quantization: (raw.quantization as string | null) ?? null,
    tokenizer_files: need(raw, "tokenizer_files"),
    bos_token_id: (raw.bos_token_id as number | null) ?? null,
    eos_token_ids: ((raw.eos_token_ids as number[]) ?? []).map(Number),
    weights_file: need(raw, "weights_file"),
    graphs,
    draft: (raw.draft as ModelInfo | null) ?? null,
    schema_version: raw.schema_version as number,
    variant,
    backbone_fingerprint: (raw.backbone_fingerprint as string | undefined) ?? "",
    chat: chat ? { templates: chat.templates, special_tokens: chat.special_tokens ?? {}, generation: chat.generation ?? {} } : null,
    feature_layers: featureLayers,
    extra: (raw.extra as Record<string, unknown> | undefined) ?? {},
    step_width: stepWidth(raw),
  };
}

/** The manifest's `step_width`; absent (older bundles): 2 for quantized ones (`bundle.py`). */
function stepWidth(raw: Record<string, unknown>): number {
  const gguf = (raw.extra as { gguf?: { weights?: unknown } } | undefined)?.gguf;
  const quantized = JSON.stringify(gguf?.weights ?? "").includes("MatMulNBits")
    || ["int8", "int4", "qdq-int8"].includes(raw.quantization as string);
  const width = raw.step_width === undefined ? (quantized ? 2 : 1) : Number(raw.step_width);
  if (!(width === 1 || width === 2)) throw new Error(`step_width is ${String(raw.step_width)}, not 1 or 2`);
  return width;
}

/** What a load without a mode runs: the mode, its drafter where it chains one, and self-spec's
 * exit layer. */
export interface ModeChoice {
  mode: "spec" | "self-spec" | "eagle" | "lookup";
  drafter?: "lookup+draft" | "lookup+eagle";
  exitLayer?: number;
}

/** How much a drafter must promise over plain decoding to be the default (`costs.py`). */
export const DEFAULT_MARGIN = 1.03;

/** The local mode this bundle decodes fastest in, as the Python runtime picks it without a
 * calibration of this device (`policies/costs.py` `best_local`; a calibration times the Python
 * runtime's rounds, so the JavaScript package does not read one): the feature head after prompt
 * lookup where distill measured that chain beating lookup alone and plain decoding
 * (`eagle_pays`); else the draft model after prompt lookup; else the deepest exit whose fitted
 * adapter agrees with the final layer on more than k/L + 0.1 of tokens; else prompt lookup. */
export function bestLocal(manifest: Manifest): ModeChoice {
  const roles = new Set(manifest.graphs.map((g) => g.role));
  const eagle = manifest.extra.eagle as { decode_speedup?: Record<string, unknown> } | undefined;
  const measured = eagle?.decode_speedup;
  const chain = Number(measured?.["lookup+eagle"]), lookup = Number(measured?.lookup);
  if (roles.has("eagle") && chain > DEFAULT_MARGIN * Math.max(lookup, 1)) return { mode: "eagle", drafter: "lookup+eagle" };
  if (roles.has("draft")) return { mode: "spec", drafter: "lookup+draft" };
  const fitted = (manifest.extra.exit_adapters ?? {}) as Record<string, { top1_after?: unknown }>;
  const exits = exitLayers(manifest), layers = manifest.target.num_layers;
  const paying = Object.entries(fitted)
    .map(([k, record]) => [Number(k), Number(record?.top1_after ?? 0)] as const)
    .filter(([k, top1]) => exits.includes(k) && top1 > k / layers + 0.1)
    .map(([k]) => k);
  if (paying.length) return { mode: "self-spec", exitLayer: Math.max(...paying) };
  return { mode: "lookup" };
}
