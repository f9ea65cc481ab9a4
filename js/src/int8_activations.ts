/** onnxruntime's native CPU numerics for 4- and 8-bit blocks in onnxruntime-web (wasm).

A MatMulNBits node (com.microsoft) with `accuracy_level` 4 runs, in onnxruntime's native CPU
kernels (MLAS "CompInt8": onnxruntime-node, the Python runtime), on int8 activations: each row
of A is cut into blocks of the node's `block_size` along K, and each block is quantized as
`scale = amax / 127`, `q = round_half_even(a * (127 / amax))` (the reciprocal divided from amax
itself, not 1 / scale; 0 where amax is 0), then dotted in integers with B's blocks and scaled by
`scale * B's scale`. onnxruntime-web's wasm kernel ignores the level and multiplies the float A:
the logits then differ by the quantization error, and greedy tokens part from the Python
runtime's after some dozens (tests/test_js_browser.py measured it on a Q4_1 GGUF import).

`int8Activations(bytes, file)` gives every such node that quantization in the graph itself:
its input A goes through Reshape [-1, block] -> Abs -> ReduceMax -> (Max with 1e-30) -> 127 /
amax, amax / 127 -> Mul -> Round (half to even, as MLAS's `_MM_ROUND_NEAREST`) -> Mul -> Reshape
back, so the kernel multiplies exactly the values native dots in integers (bit for bit, on the
one-node graphs of tests/test_js_int8_activations.py). Nodes reading the same A with the same
block share one copy; any other reader of A (a Q4_1 import's block-minima ReduceSum, which
native computes from the float A too) still reads the float A. K not a multiple of the block
is padded with zeros to whole blocks, as MLAS pads. What is left between the two runtimes is
fp32 summation order; but int8 rounding turns those ulps into whole int8 steps a layer later, so
on a 30-layer Q4_1 model (SmolLM2-135M) the edited wasm graph's logits stay as far from native as
the unedited (median max |dlogit| 0.75 vs 0.71 a step) and greedy tokens part as early. Graphs without such a node come back unchanged;
the edit walks the protobuf wire format like `onnx_edit.ts` and copies all else byte for byte. */

import { BundleError } from "./errors.js";
import { type Attribute, concat, encodeNode, fields, lengthDelimited, text, utf8, varint } from "./onnx_edit.js";

const PREFIX = "edgespec.int8";
const NBITS = "MatMulNBits";
const MS_DOMAIN = "com.microsoft";

interface NbitsNode {
  a: string;
  block: number;
  k: number;
}

/** The node's A, block and K if it is an accuracy-level-4 MatMulNBits, else null. */
function nbitsNode(b: Uint8Array, from: number, to: number): NbitsNode | null {
  let op = "", domain = "", a: string | null = null, level = 0, block = 128, k = 0;
  for (const f of fields(b, from, to)) {
    if (f.wire !== 2) continue;
    if (f.number === 4) op = text.decode(b.subarray(f.body, f.end));
    else if (f.number === 7) domain = text.decode(b.subarray(f.body, f.end));
    else if (f.number === 1 && a === null) a = text.decode(b.subarray(f.body, f.end));
    else if (f.number === 5) {
      let name = "", value = 0;
      for (const g of fields(b, f.body, f.end)) {
        if (g.number === 1 && g.wire === 2) name = text.decode(b.subarray(g.body, g.end));
        else if (g.number === 3 && g.wire === 0) value = varint(b, g.body)[0];
      }
      if (name === "accuracy_level") level = value;
      else if (name === "block_size") block = value;
      else if (name === "K") k = value;
    }
  }
  if (op !== NBITS || domain !== MS_DOMAIN || level !== 4 || !a) return null;
  if (!(block > 0 && k > 0)) throw new BundleError(`a ${NBITS} node has block_size ${block} and K ${k}: re-export the bundle`);
  return { a, block, k };
}

/** The default domain's opset (ModelProto.opset_import 8: domain 1, version 2). */
function opset(b: Uint8Array): number {
  for (const f of fields(b)) {
    if (f.number !== 8 || f.wire !== 2) continue;
    let domain = "", version = 0;
    for (const g of fields(b, f.body, f.end)) {
      if (g.number === 1 && g.wire === 2) domain = text.decode(b.subarray(g.body, g.end));
      else if (g.number === 2 && g.wire === 0) version = varint(b, g.body)[0];
    }
    if (domain === "" || domain === "ai.onnx") return version;
  }
  return 0;
}

/** The nodes quantizing `a` per block (names `${PREFIX}.${id}.*`); its output `${out}`. */
function quantizeNodes(node: NbitsNode, id: number, out: string, reduceAxesAsInput: boolean): Uint8Array[] {
  const { a, block, k } = node;
  const n = (s: string) => `${PREFIX}.${id}.${s}`;
  const padded = Math.ceil(k / block) * block;
  const nodes: [string, string[], string[], Attribute[]?][] = [];
  const constant = (name: string, value: Attribute[1]) =>
    nodes.push(["Constant", [], [n(name)], [[typeof value === "object" && !Array.isArray(value) ? "value_float" : "value_ints", value]]]);
  constant("blocks", [-1, block]);
  if (reduceAxesAsInput || padded !== k) constant("axes", [1]);
  constant("c127", { float: 127 });
  constant("tiny", { float: 1e-30 });
  nodes.push(["Shape", [a], [n("shape")]]);
  let flat = a;
  if (padded !== k) { // MLAS quantizes a last, partial block as if padded with zeros
    constant("rows", [-1, k]);
    constant("pads", [0, 0, 0, padded - k]);
    nodes.push(["Reshape", [a, n("rows")], [n("rows2d")]]);
    nodes.push(["Pad", [n("rows2d"), n("pads")], [n("padded")]]);
    flat = n("padded");
  }
  nodes.push(["Reshape", [flat, n("blocks")], [n("x")]]);
  nodes.push(["Abs", [n("x")], [n("abs")]]);
  if (reduceAxesAsInput) nodes.push(["ReduceMax", [n("abs"), n("axes")], [n("amax")], [["keepdims", 1]]]);
  else nodes.push(["ReduceMax", [n("abs")], [n("amax")], [["axes", [1]], ["keepdims", 1]]]);
  // amax 0: the block is zeros, any finite reciprocal gives 0 (MLAS takes 0)
  nodes.push(["Max", [n("amax"), n("tiny")], [n("nonzero")]]);
  nodes.push(["Div", [n("c127"), n("nonzero")], [n("inverse")]]);
  nodes.push(["Div", [n("amax"), n("c127")], [n("scale")]]);
  nodes.push(["Mul", [n("x"), n("inverse")], [n("scaled")]]);
  nodes.push(["Round", [n("scaled")], [n("q")]]);
  nodes.push(["Mul", [n("q"), n("scale")], [n("dq")]]);
  if (padded !== k) {
    constant("prows", [-1, padded]);
    constant("starts", [0]);
    constant("ends", [k]);
    nodes.push(["Reshape", [n("dq"), n("prows")], [n("dq2d")]]);
    nodes.push(["Slice", [n("dq2d"), n("starts"), n("ends"), n("axes")], [n("dqk")]]);
    nodes.push(["Reshape", [n("dqk"), n("shape")], [out]]);
  } else nodes.push(["Reshape", [n("dq"), n("shape")], [out]]);
  return nodes.map(([op, inputs, outputs, attributes], i) => lengthDelimited(1, encodeNode(op, inputs, outputs, n(`${i}.${op}`), attributes)));
}

/** `bytes` (an ONNX model) with every accuracy-level-4 MatMulNBits node's A quantized per
 * block as onnxruntime's native CPU kernels quantize it (see the top); unchanged if none. */
export function int8Activations(bytes: Uint8Array, file: string): Uint8Array {
  try {
    const axesAsInput = opset(bytes) >= 18;
    const parts: Uint8Array[] = [];
    let edited = 0;
    for (const f of fields(bytes)) {
      if (f.number !== 7 || f.wire !== 2) {
        parts.push(bytes.subarray(f.start, f.end));
        continue;
      }
      const graph: Uint8Array[] = [];
      const quantized = new Map<string, string>(); // `${a}|${block}` -> its quantized copy
      for (const g of fields(bytes, f.body, f.end)) {
        const node = g.number === 1 && g.wire === 2 ? nbitsNode(bytes, g.body, g.end) : null;
        if (!node) {
          graph.push(bytes.subarray(g.start, g.end));
          continue;
        }
        const key = `${node.a}|${node.block}`;
        let q = quantized.get(key);
        if (q === undefined) {
          q = `${PREFIX}.${quantized.size}.out`;
          graph.push(...quantizeNodes(node, quantized.size, q, axesAsInput));
          quantized.set(key, q);
        }
        // the node with its first input (A) renamed: every other field byte for byte
        const out: Uint8Array[] = [];
        let first = true;
        for (const n of fields(bytes, g.body, g.end)) {
          if (first && n.number === 1 && n.wire === 2) {
            out.push(lengthDelimited(1, utf8.encode(q)));
            first = false;
          } else out.push(bytes.subarray(n.start, n.end));
        }
        graph.push(lengthDelimited(1, concat(out)));
        edited++;
      }
      parts.push(lengthDelimited(7, concat(graph)));
    }
    return edited ? concat(parts) : bytes;
  } catch (e) {
    if (e instanceof BundleError) throw new BundleError(`${file}: ${e.message}`);
    throw e;
  }
}
