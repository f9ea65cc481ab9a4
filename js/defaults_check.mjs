// What a load that names no mode runs (src/model.ts resolveMode, src/bundle.ts bestLocal) and how
// wide its target steps (src/graph.ts settleStepWidth), beside the Python runtime's choice
// (tests/test_js_default_bundle.py): node defaults_check.mjs BUNDLE PROMPT N [MODE] prints
// {mode, drafter, stepWidth, tokens}: the mode loaded, its drafter's name, the target's step
// width, and a greedy generation of N tokens.
import { folderFiles, loadModel } from "./dist/node.js";
import ort from "onnxruntime-node";

const [dir, prompt, n, mode] = process.argv.slice(2);
const model = await loadModel(folderFiles(dir), ort, { mode: mode || undefined });
const { tokens } = await model.generate(prompt, { maxNewTokens: Number(n), ignoreEos: true });
const stepWidth = model.verifier.target.stepWidth;
console.log(JSON.stringify({ mode: model.mode, drafter: model.drafter.name, stepWidth, tokens }));
