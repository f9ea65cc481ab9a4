/** Chat templates (`runtime/chat/template.py`): the bundle's Hugging Face jinja templates,
rendered with `@huggingface/jinja` as transformers renders them. */

import { Template } from "@huggingface/jinja";
import { EdgespecError, InputError } from "./errors.js";
import type { ChatFormat } from "./bundle.js";
import type { BundleFiles } from "./files.js";

export class ChatTemplateError extends EdgespecError {
  override name = "ChatTemplateError";
}

export interface Message {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface RenderOptions {
  addGenerationPrompt?: boolean;
  template?: string;
  tools?: Record<string, unknown>[];
  /** Extra template variables, e.g. { enable_thinking: false }. */
  flags?: Record<string, unknown>;
}

export class ChatTemplate {
  constructor(readonly templates: Record<string, string>, readonly specialTokens: Record<string, string>) {}

  static async fromBundle(files: BundleFiles, chat: ChatFormat | null): Promise<ChatTemplate> {
    if (!chat) {
      throw new ChatTemplateError(
        `bundle ${files.where} has no chat template (its checkpoint is a base model): use generate() ` +
          "with a plain prompt, or re-export a checkpoint whose tokenizer has a chat template",
      );
    }
    const texts: Record<string, string> = {};
    for (const [name, rel] of Object.entries(chat.templates)) texts[name] = await files.readText(rel);
    return new ChatTemplate(texts, chat.special_tokens);
  }

  pick(name?: string, tools?: unknown): string {
    const t = this.templates;
    if (name !== undefined) {
      if (!(name in t)) throw new ChatTemplateError(`no chat template named '${name}' (this bundle has: ${Object.keys(t).sort().join(", ")})`);
      return t[name];
    }
    if (tools !== undefined && "tool_use" in t) return t.tool_use;
    if ("default" in t) return t.default;
    const names = Object.keys(t);
    if (names.length === 1) return t[names[0]];
    throw new ChatTemplateError(
      `this bundle has several chat templates and none is named 'default': choose one with template (${names.sort().join(", ")})`,
    );
  }

  render(messages: Message[], o: RenderOptions = {}): string {
    if (!Array.isArray(messages) || !messages.length) {
      throw new InputError("messages must be a non-empty list of {role, content} objects");
    }
    for (const [i, m] of messages.entries()) {
      if (typeof m?.role !== "string" || (typeof m.content !== "string" && m.content !== null)) {
        throw new InputError(`message ${i} needs a string 'role' and a string 'content'`);
      }
    }
    let compiled: Template;
    try {
      compiled = new Template(this.pick(o.template, o.tools));
    } catch (e) {
      throw new ChatTemplateError(`the bundle's chat template does not parse: ${(e as Error).message}`);
    }
    try {
      return compiled.render({
        ...this.specialTokens,
        ...(o.flags ?? {}),
        messages,
        tools: o.tools ?? null,
        add_generation_prompt: o.addGenerationPrompt ?? true,
        dict: templateDict,
      });
    } catch (e) {
      // raise_exception (the template's own refusal) and runtime errors alike
      throw new ChatTemplateError(`the chat template refused this conversation: ${(e as Error).message}`);
    }
  }
}


/** `dict(a=1, ...)` as Python's jinja2 gives templates (keyword arguments arrive as a Map). */
function templateDict(...args: unknown[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const a of args) {
    // keyword arguments arrive as a Map of the interpreter's values ({type, value})
    if (a instanceof Map) for (const [k, v] of a) out[String(k)] = plainValue(v);
    else if (a && typeof a === "object") Object.assign(out, a);
  }
  return out;
}

function plainValue(v: unknown): unknown {
  if (v && typeof v === "object" && "type" in v && "value" in v) {
    const inner = (v as { value: unknown }).value;
    if (inner instanceof Map) return Object.fromEntries([...inner].map(([k, x]) => [k, plainValue(x)]));
    if (Array.isArray(inner)) return inner.map(plainValue);
    return inner;
  }
  return v;
}
