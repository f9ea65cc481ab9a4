/** An app screen running edgespec on the phone through onnxruntime-react-native: pick a mode,
type a prompt, watch the tokens stream, see tokens per second. The bundle (a default
`edgespec export`, or one made with `--no-batched-verify`) lies in a folder on the device (`BUNDLE_DIR`).
Type-checked and bundled by tests/test_js_react_native.py; not run on a phone here. */

import { useRef, useState } from "react";
import { Button, SafeAreaView, ScrollView, Text, TextInput, View } from "react-native";
import * as ort from "onnxruntime-react-native";
import { loadModel, type Model, type Mode } from "edgespec/core";
import { deviceFiles } from "./bundleFiles";

export const BUNDLE_DIR = "/data/user/0/com.example.edgespec/files/bundle"; // where the app put it
const MODES: Mode[] = ["ar", "spec", "self-spec", "lookup"];

export default function App() {
  const [mode, setMode] = useState<Mode>("spec");
  const [prompt, setPrompt] = useState("def parse(x):\n    return");
  const [text, setText] = useState("");
  const [status, setStatus] = useState("");
  const models = useRef(new Map<Mode, Model>());
  const abort = useRef<AbortController | null>(null);

  async function model(m: Mode): Promise<Model> {
    const held = models.current.get(m);
    if (held) return held;
    // onnxruntime-react-native: the CPU provider, or "coreml" (iOS) / "nnapi" (Android)
    const loaded = await loadModel(deviceFiles(BUNDLE_DIR), ort, {
      mode: m,
      kvOutputs: "returned", // the native binding hands back new output tensors
      sessionOptions: { executionProviders: ["cpu"] },
      onProgress: setStatus,
    });
    models.current.set(m, loaded);
    return loaded;
  }

  async function generate() {
    abort.current?.abort();
    const controller = new AbortController();
    abort.current = controller;
    setText("");
    try {
      const m = await model(mode);
      let tokens = 0, seconds = 0;
      for await (const chunk of m.stream(prompt, { maxNewTokens: 128, signal: controller.signal })) {
        setText((t) => t + chunk.text);
        if (chunk.stats.kind === "decode") {
          tokens += chunk.tokens.length;
          seconds += chunk.stats.seconds;
        }
        setStatus(`${mode}: ${tokens} tokens, ${(tokens / Math.max(seconds, 1e-9)).toFixed(1)} tokens/s`);
      }
    } catch (e) {
      setStatus(`${(e as Error).name}: ${(e as Error).message}`);
    }
  }

  return (
    <SafeAreaView style={{ flex: 1, padding: 16 }}>
      <View style={{ flexDirection: "row", flexWrap: "wrap", gap: 8 }}>
        {MODES.map((m) => (
          <Button key={m} title={m === mode ? `[${m}]` : m} onPress={() => setMode(m)} />
        ))}
      </View>
      <TextInput multiline value={prompt} onChangeText={setPrompt} style={{ borderWidth: 1, minHeight: 80, marginVertical: 8 }} />
      <View style={{ flexDirection: "row", gap: 8 }}>
        <Button title="Generate" onPress={generate} />
        <Button title="Stop" onPress={() => abort.current?.abort()} />
      </View>
      <Text style={{ marginVertical: 8 }}>{status}</Text>
      <ScrollView>
        <Text style={{ fontFamily: "monospace" }}>{text}</Text>
      </ScrollView>
    </SafeAreaView>
  );
}
