/** The bundle's tokenizer: `tokenizer.json` through `@huggingface/tokenizers`, checked by the
conformance tests to give the Python runtime's ids (`edgespec/runtime/tokenizer`) exactly. */

import { Tokenizer as HFTokenizer } from "@huggingface/tokenizers";
import { BundleError } from "./errors.js";
import type { BundleFiles } from "./files.js";

/** tokenizer.json's decoder chain as a list (a `Sequence` unpacked). */
function decoderChain(json: Record<string, unknown>): Array<Record<string, unknown>> {
  const d = json.decoder as Record<string, unknown> | null | undefined;
  if (!d) return [];
  return d.type === "Sequence" ? (d.decoders as Array<Record<string, unknown>>) : [d];
}

/** Whether streamed text may restart its decoding after a token (`is_stream_local` in
 * `runtime/tokenizer/decoder.py`) with this package's decode: the chain must also ignore
 * whether a token starts the sequence (Metaspace and Strip do not; the Python runtime passes
 * that flag, `@huggingface/tokenizers` cannot) and hold no byte-fallback pieces. */
export function streamLocal(decoders: Array<Record<string, unknown>>): boolean {
  if (!decoders.length) return false;
  let fused = false;
  for (const c of decoders) {
    const kind = c.type as string;
    if (!["ByteLevel", "Replace", "Fuse"].includes(kind)) return false;
    fused ||= kind === "ByteLevel" || kind === "Fuse";
    const pattern = Object.values((c.pattern ?? {}) as Record<string, string>)[0] ?? "";
    if (fused && kind === "Replace" && pattern.length !== 1) return false;
  }
  return true;
}

export class Tokenizer {
  /** `streamLocal` of the bundle's decoder chain: streamed text decodes from the last
   * restart point, not from the first generated token (linear, not quadratic, in its length). */
  constructor(readonly hf: HFTokenizer, readonly streamLocal = false) {}

  static async fromBundle(files: BundleFiles): Promise<Tokenizer> {
    const read = async (name: string): Promise<object> => {
      try {
        return (await files.exists(name)) ? JSON.parse(await files.readText(name)) : {};
      } catch (e) {
        throw new BundleError(`${files.where}/${name} is not valid JSON (${(e as Error).message}); re-export the bundle`);
      }
    };
    const json = await read("tokenizer.json");
    if (!("model" in json)) throw new BundleError(`${files.where} has no tokenizer.json: re-export the bundle`);
    try {
      const hf = new HFTokenizer(json, await read("tokenizer_config.json"));
      return new Tokenizer(hf, streamLocal(decoderChain(json as Record<string, unknown>)));
    } catch (e) {
      throw new BundleError(`${files.where}/tokenizer.json cannot be read (${(e as Error).message})`);
    }
  }

  encode(text: string, addSpecialTokens = true): number[] {
    return this.hf.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  /** The text of `ids` as the Python runtime decodes it: without transformers' clean-up of
   * spaces before punctuation (which `@huggingface/tokenizers` applies unless told not to). */
  decode(ids: number[], skipSpecialTokens = false): string {
    if (!ids.length) return "";
    return this.hf.decode(ids, { skip_special_tokens: skipSpecialTokens, clean_up_tokenization_spaces: false });
  }

  idToToken(id: number): string | undefined {
    return this.hf.id_to_token(id);
  }

  streamDecoder(skipSpecialTokens = true): StreamDecoder {
    return new StreamDecoder(this, skipSpecialTokens);
  }
}

/** Text as tokens arrive (`StreamDecoder` in `runtime/tokenizer/decoder.py`): a piece is
 * released once it no longer ends inside a character; the pieces concatenate to the decoded
 * ids. Where the decoder chain is stream-local, decoding restarts after each released piece,
 * so a token costs the same at the end of a long reply as at its start. */
export class StreamDecoder {
  private ids: number[] = []; // the window still being decoded
  private emitted = ""; // text already returned for the window
  constructor(readonly tokenizer: Tokenizer, readonly skip: boolean) {}

  push(id: number): string {
    this.ids.push(id);
    const text = this.tokenizer.decode(this.ids, this.skip);
    if (text.endsWith("\ufffd") || !text.startsWith(this.emitted)) return "";
    const piece = text.slice(this.emitted.length);
    if (this.tokenizer.streamLocal && text) {
      this.ids = [];
      this.emitted = "";
    } else {
      this.emitted = text;
    }
    return piece;
  }

  flush(): string {
    const text = this.tokenizer.decode(this.ids, this.skip);
    const piece = text.startsWith(this.emitted) ? text.slice(this.emitted.length) : "";
    this.ids = [];
    this.emitted = "";
    return piece;
  }
}
