/** Bundles from a default `edgespec export` in onnxruntime's JavaScript packages.

A default export's graphs give GroupQueryAttention input 16, `query_seqlens` (a verifier server
batches rounds of different widths with it), which onnxruntime loads from 1.32 on; npm's
onnxruntime-node and onnxruntime-web are older (1.30 here, 1.31.1 the newest) and refuse the
node. With one sequence a call, the input says what the call's width says already, so
`withoutBatchedAttention(bytes, file)` drops inputs 9.. of each GroupQueryAttention node (input 16 and
the empty ones before it): the attention is then the `--no-batched-verify` graph's, the rest of
the graph still reads `query_seqlens` (fed the call's width), and the logits are bitwise the
`--no-batched-verify` graph's (tests/test_js_default_bundle.py). The edit walks the protobuf
wire format (ModelProto.graph 7, GraphProto.node 1, NodeProto.input 1 / op_type 4) and
re-encodes only the nodes it changes; everything else is copied byte for byte.

`appendingOutputs(bytes, file, input)` is the graph onnxruntime-node runs where it copies every
output back (`KVOutputs` "appended", graph.ts): each `present_*` output becomes a Slice of the
call's new positions (`[total_seq_len - width, total_seq_len)` of the attention's present, the
width read from the `input`'s second dimension), a few KB a position instead of the whole
cache. The attention and every other node are unchanged: the logits are bitwise the unedited
graph's (tests/test_js_conformance.py). */

import { BundleError } from "./errors.js";

const ATTENTION = "GroupQueryAttention";
const KEEP_INPUTS = 9; // query, key, value, past key, past value, seqlens_k, total_len, cos, sin

interface Field {
  number: number;
  wire: number;
  start: number; // the tag's first byte
  body: number; // a length-delimited field's payload start
  end: number;
}

function varint(b: Uint8Array, at: number): [number, number] {
  let value = 0, scale = 1;
  for (;;) {
    if (at >= b.length) throw new BundleError("the file ends inside a protobuf varint: re-export the bundle");
    const byte = b[at++];
    value += (byte & 0x7f) * scale;
    if (byte < 0x80) return [value, at];
    scale *= 128;
  }
}

function* fields(b: Uint8Array, from = 0, to = b.length): Generator<Field> {
  let at = from;
  while (at < to) {
    const start = at;
    const [tag, next] = varint(b, at);
    at = next;
    const number = Math.floor(tag / 8), wire = tag & 7;
    let body = at;
    if (wire === 0) at = varint(b, at)[1];
    else if (wire === 1) at += 8;
    else if (wire === 5) at += 4;
    else if (wire === 2) {
      const [length, payload] = varint(b, at);
      body = payload;
      at = payload + length;
    } else throw new BundleError(`the file has protobuf wire type ${wire}: it is not an ONNX model; re-export the bundle`);
    if (at > to) throw new BundleError("the file is truncated: re-export the bundle");
    yield { number, wire, start, body, end: at };
  }
}

function encodeVarint(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n % 128) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

function lengthDelimited(number: number, payload: Uint8Array): Uint8Array {
  const head = [...encodeVarint(number * 8 + 2), ...encodeVarint(payload.length)];
  const out = new Uint8Array(head.length + payload.length);
  out.set(head);
  out.set(payload, head.length);
  return out;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const text = new TextDecoder();
const utf8 = new TextEncoder();

type Attribute = [name: string, value: number | number[]];

/** A NodeProto (input 1, output 2, name 3, op_type 4, attribute 5) of the default domain;
 * attributes of one int (AttributeProto i 3, type INT 2) or of ints (ints 8, type INTS 7). */
function encodeNode(op: string, inputs: string[], outputs: string[], name: string, attributes: Attribute[] = []): Uint8Array {
  const parts = [
    ...inputs.map((n) => lengthDelimited(1, utf8.encode(n))),
    ...outputs.map((n) => lengthDelimited(2, utf8.encode(n))),
    lengthDelimited(3, utf8.encode(name)),
    lengthDelimited(4, utf8.encode(op)),
  ];
  for (const [key, value] of attributes) {
    const one = typeof value === "number", ints = one ? [value] : value;
    const body = [lengthDelimited(1, utf8.encode(key)), ...ints.map((v) => Uint8Array.from([...encodeVarint((one ? 3 : 8) * 8), ...encodeVarint(v)]))];
    body.push(Uint8Array.from([...encodeVarint(20 * 8), one ? 2 : 7]));
    parts.push(lengthDelimited(5, concat(body)));
  }
  return concat(parts);
}

/** A NodeProto with inputs 9.. dropped if it is GroupQueryAttention; null if unchanged. */
function editNode(b: Uint8Array, from: number, to: number): Uint8Array | null {
  const all = [...fields(b, from, to)];
  const op = all.find((f) => f.number === 4 && f.wire === 2);
  if (!op || text.decode(b.subarray(op.body, op.end)) !== ATTENTION) return null;
  const inputs = all.filter((f) => f.number === 1 && f.wire === 2);
  let keep = Math.min(inputs.length, KEEP_INPUTS);
  while (keep > 0 && inputs[keep - 1].end === inputs[keep - 1].body) keep--; // trailing ""
  if (keep === inputs.length) return null;
  const dropped = new Set(inputs.slice(keep));
  return concat(all.filter((f) => !dropped.has(f)).map((f) => b.subarray(f.start, f.end)));
}

/** `bytes` (an ONNX model) with each GroupQueryAttention node's inputs from 9 on dropped. */
export function withoutBatchedAttention(bytes: Uint8Array, file: string): Uint8Array {
  try {
    return edit(bytes, file);
  } catch (e) {
    if (e instanceof BundleError) throw new BundleError(`${file}: ${e.message}`);
    throw e;
  }
}

function edit(bytes: Uint8Array, file: string): Uint8Array {
  const parts: Uint8Array[] = [];
  let edited = false;
  for (const f of fields(bytes)) {
    if (f.number !== 7 || f.wire !== 2) {
      parts.push(bytes.subarray(f.start, f.end));
      continue;
    }
    const graph: Uint8Array[] = [];
    for (const g of fields(bytes, f.body, f.end)) {
      const node = g.number === 1 && g.wire === 2 ? editNode(bytes, g.body, g.end) : null;
      if (node) edited = true;
      graph.push(node ? lengthDelimited(1, node) : bytes.subarray(g.start, g.end));
    }
    parts.push(lengthDelimited(7, concat(graph)));
  }
  if (!edited) throw new BundleError(
      `manifest.json says ${file} takes query_seqlens, but no ${ATTENTION} node in it does: the graph file and ` +
        "the manifest come from different exports — re-export the bundle",
    );
  return concat(parts);
}

/** The files an ONNX model's initializers keep their data in (TensorProto.external_data's
 * "location": ModelProto.graph 7, GraphProto.initializer 5, TensorProto.external_data 13,
 * StringStringEntryProto key 1 / value 2), in first-use order: a feature head's graph reads
 * the target's tensors from the bundle's weights file and its own from another. */
export function externalFiles(bytes: Uint8Array, file: string): string[] {
  const out = new Set<string>();
  try {
    for (const f of fields(bytes)) {
      if (f.number !== 7 || f.wire !== 2) continue;
      for (const g of fields(bytes, f.body, f.end)) {
        if (g.number !== 5 || g.wire !== 2) continue;
        for (const t of fields(bytes, g.body, g.end)) {
          if (t.number !== 13 || t.wire !== 2) continue;
          let key = "", value = "";
          for (const e of fields(bytes, t.body, t.end)) {
            if (e.wire !== 2) continue;
            if (e.number === 1) key = text.decode(bytes.subarray(e.body, e.end));
            else if (e.number === 2) value = text.decode(bytes.subarray(e.body, e.end));
          }
          if (key === "location" && value) out.add(value);
        }
      }
    }
  } catch (e) {
    if (e instanceof BundleError) throw new BundleError(`${file}: ${e.message}`);
    throw e;
  }
  return [...out];
}

const SLICE = "edgespec.new_positions"; // the prefix of the names the edit adds

/** `bytes` with each `present_*` output cut to the call's new positions (see the top). */
export function appendingOutputs(bytes: Uint8Array, file: string, input: string): Uint8Array {
  const [starts, ends, axes] = [`${SLICE}.starts`, `${SLICE}.ends`, `${SLICE}.axes`];
  const shared = [
    encodeNode("Cast", ["total_seq_len"], [`${SLICE}.total`], `${SLICE}.cast`, [["to", 7]]),
    encodeNode("Constant", [], [`${SLICE}.zero`], `${SLICE}.zero`, [["value_ints", [0]]]),
    encodeNode("Constant", [], [axes], `${SLICE}.axes`, [["value_ints", [2]]]),
    encodeNode("Unsqueeze", [`${SLICE}.total`, `${SLICE}.zero`], [ends], `${SLICE}.ends`),
    encodeNode("Shape", [input], [`${SLICE}.width`], `${SLICE}.width`, [["start", 1], ["end", 2]]),
    encodeNode("Sub", [ends, `${SLICE}.width`], [starts], `${SLICE}.starts`),
  ].map((n) => lengthDelimited(1, n));
  const present = (name: string) => name.startsWith("present_key.") || name.startsWith("present_value.");
  try {
    const parts: Uint8Array[] = [];
    let cut = 0;
    for (const f of fields(bytes)) {
      if (f.number !== 7 || f.wire !== 2) {
        parts.push(bytes.subarray(f.start, f.end));
        continue;
      }
      const graph: Uint8Array[] = [...shared], slices: Uint8Array[] = [];
      for (const g of fields(bytes, f.body, f.end)) {
        if (g.number !== 1 || g.wire !== 2) {
          graph.push(bytes.subarray(g.start, g.end));
          continue;
        }
        // a node writing a present_* output writes `<name>.all` instead, which a Slice cuts
        const node: Uint8Array[] = [];
        let changed = false;
        for (const n of fields(bytes, g.body, g.end)) {
          const name = n.wire === 2 && (n.number === 1 || n.number === 2) ? text.decode(bytes.subarray(n.body, n.end)) : "";
          if (n.number === 1 && present(name)) {
            throw new BundleError(`a node reads ${name}, a graph output: not a graph an export makes; re-export the bundle`);
          }
          if (n.number !== 2 || !present(name)) {
            node.push(bytes.subarray(n.start, n.end));
            continue;
          }
          node.push(lengthDelimited(2, utf8.encode(`${name}.all`)));
          changed = true;
          slices.push(lengthDelimited(1, encodeNode("Slice", [`${name}.all`, starts, ends, axes], [name], `${SLICE}.${name}`)));
          cut++;
        }
        graph.push(changed ? lengthDelimited(1, concat(node)) : bytes.subarray(g.start, g.end));
      }
      parts.push(lengthDelimited(7, concat([...graph, ...slices])));
    }
    if (!cut) throw new BundleError("the graph has no present_* output to cut: re-export the bundle");
    return concat(parts);
  } catch (e) {
    if (e instanceof BundleError) throw new BundleError(`${file}: ${e.message}`);
    throw e;
  }
}
