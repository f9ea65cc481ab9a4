/** The bundle's tokenizer: `tokenizer.json` through `@huggingface/tokenizers`, checked by the
conformance tests to give the Python runtime's ids (`edgespec/runtime/tokenizer`) exactly. */

import { Tokenizer as HFTokenizer } from "@huggingface/tokenizers";
import { BundleError } from "./errors.js";
import type { BundleFiles } from "./files.js";

export class Tokenizer {
  constructor(readonly hf: HFTokenizer) {}

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
      return new Tokenizer(new HFTokenizer(json, await read("tokenizer_config.json")));
    } catch (e) {
      throw new BundleError(`${files.where}/tokenizer.json cannot be read (${(e as Error).message})`);
    }
  }

  encode(text: string, addSpecialTokens = true): number[] {
    return this.hf.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  decode(ids: number[], skipSpecialTokens = false): string {
    return this.hf.decode(ids, { skip_special_tokens: skipSpecialTokens });
  }

  idToToken(id: number): string | undefined {
    return this.hf.id_to_token(id);
  }

  streamDecoder(skipSpecialTokens = true): StreamDecoder {
    return new StreamDecoder(this, skipSpecialTokens);
  }
}

/** Text as tokens arrive: a piece is released once it no longer ends inside a character. */
export class StreamDecoder {
  private ids: number[] = [];
  private emitted = "";
  constructor(readonly tokenizer: Tokenizer, readonly skip: boolean) {}

  push(id: number): string {
    this.ids.push(id);
    const text = this.tokenizer.decode(this.ids, this.skip);
    if (text.endsWith("\ufffd") || !text.startsWith(this.emitted)) return "";
    const piece = text.slice(this.emitted.length);
    this.emitted = text;
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
