// npm run bundle: App.tsx with edgespec, its tokenizer and template packages as one module
// (dist/app.js); react, react-native and onnxruntime-react-native stay imports, as the app's
// own bundler (Metro) provides them with their native parts.
import { build } from "esbuild";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
await build({
  entryPoints: [join(here, "App.tsx")],
  bundle: true,
  format: "esm",
  platform: "neutral",
  mainFields: ["react-native", "module", "main"],
  conditions: ["react-native", "import", "default"],
  target: "es2022",
  jsx: "automatic",
  external: ["react", "react/jsx-runtime", "react-native", "onnxruntime-react-native"],
  outfile: join(here, "dist", "app.js"),
  logLevel: "warning",
});
