/** Split decoding, the device's side (`runtime/split/verifier.py`, `runtime/split/session.py`): the
target runs on a server (`edgespec serve`), the device drafts and the server verifies, one
WebSocket (`/v1/session`) per model, one session per generation.

`RemoteVerifier` is a `Verifier`: prefill sends START (the server prefills and answers the
first token), each round sends VERIFY with the drafts after the committed sequence (and, when
sampling with a model drafter, the q each draft was drawn from) and reads RESULT (how many
drafts the server kept, and its next token); the server truncates its own cache. A generation
ends with END, or with PAUSE when the model keeps its conversation (`chat`): the next turn's
START then keeps the positions the server still holds (`keep`) and sends only the new ids;
a server that lost them (ERROR 410/409) gets the whole sequence again on the same link.

What this port leaves to the Python device: the local fallback (a lost link ends the
generation with a `SplitError` saying so), late rounds, server streaming, grammars. */

import { EdgespecError } from "./errors.js";
import {
  decodeAnswer, encodeNotice, encodeStart, encodeVerify, END, GONE, MAX_DRAFTS, OUT_OF_SYNC, PAUSE, SUBPROTOCOL,
  verifySize, type ErrorMessage, type Result,
} from "./protocol.js";
import type { Rng, SamplingParams } from "./sampling.js";
import { now, roundStats, type Proposal, type RoundStats, type Verdict, type Verifier } from "./round.js";

export class SplitError extends EdgespecError {
  override name = "SplitError";
}

/** The link failed (no connection, closed, no answer in time): a fallback may continue. */
export class LinkError extends SplitError {
  override name = "LinkError";
}

/** The WebSocket class (the browser's, Node >= 22's, or undici's under Node 20's
 * `--experimental-websocket`); Node's takes `{ protocols, headers }` as its second argument. */
export type WebSocketClass = new (url: string, options?: string[] | { protocols: string[]; headers: Record<string, string> }) => WebSocket;

export interface SplitOptions {
  /** ws://HOST:PORT (the session path `/v1/session` is added) or a full ws(s):// URL. */
  server: string;
  /** The server's bearer token (`edgespec serve --token-file`); a browser cannot send one. */
  token?: string;
  /** Seconds to wait for the connection and for each answer (default 30). */
  timeout?: number;
  WebSocket?: WebSocketClass;
  /** Finish on the bundle's own `full` graph when the link fails (default true where the
   * bundle has one; false: the generation ends with a SplitError). */
  localFallback?: boolean;
}

/** One WebSocket to the server: messages out, answers in order. */
class Link {
  private answers: (Result | ErrorMessage | Error)[] = [];
  private waiting: ((m: Result | ErrorMessage | Error) => void) | null = null;
  closed: string | null = null;

  private constructor(private readonly ws: WebSocket, readonly url: string, private readonly timeout: number) {
    ws.binaryType = "arraybuffer";
    ws.onmessage = (e) => {
      let m: Result | ErrorMessage | Error;
      try {
        m = decodeAnswer(e.data as ArrayBuffer);
      } catch (err) {
        m = err as Error;
      }
      this.deliver(m);
    };
    ws.onclose = (e) => {
      this.closed = `the server at ${url} closed the connection (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`;
      this.deliver(new LinkError(this.closed));
    };
  }

  static async open(o: SplitOptions): Promise<Link> {
    const url = /^wss?:\/\/[^/]+\/?$/.test(o.server) ? `${o.server.replace(/\/$/, "")}/v1/session` : o.server;
    if (!/^wss?:\/\/[^/]+/.test(url)) throw new SplitError(`server ${o.server} is not a ws://HOST:PORT or wss://HOST:PORT address`);
    const WS = o.WebSocket ?? (globalThis as { WebSocket?: WebSocketClass }).WebSocket;
    if (!WS) {
      throw new SplitError("this JavaScript runtime has no WebSocket: use Node >= 22, `node --experimental-websocket` on Node 20, or pass options.WebSocket");
    }
    const inBrowser = typeof (globalThis as { document?: unknown }).document !== "undefined";
    if (o.token && inBrowser) {
      throw new SplitError("a browser's WebSocket cannot send a bearer token: serve the page's split server without --token-file on a network you trust, or put an authenticating proxy in front");
    }
    const ws = o.token ? new WS(url, { protocols: [SUBPROTOCOL], headers: { Authorization: `Bearer ${o.token}` } }) : new WS(url, [SUBPROTOCOL]);
    const timeout = (o.timeout ?? 30) * 1000;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new LinkError(`no connection to ${url} within ${timeout / 1000} s`)), timeout);
      ws.onopen = () => { clearTimeout(timer); resolve(); };
      ws.onerror = () => {
        clearTimeout(timer);
        reject(new LinkError(`cannot connect to ${url} (refused, wrong address, or the server refused the token): is \`edgespec serve\` running there?`));
      };
    });
    ws.onerror = null;
    return new Link(ws, url, timeout);
  }

  private deliver(m: Result | ErrorMessage | Error): void {
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = null;
      w(m);
    } else {
      this.answers.push(m);
    }
  }

  send(bytes: Uint8Array): void {
    if (this.closed) throw new LinkError(this.closed);
    try {
      this.ws.send(bytes);
    } catch (e) {
      throw new LinkError(`cannot send to ${this.url}: ${(e as Error).message}`);
    }
  }

  /** The next answer; an ERROR comes back as a message, a lost link as a SplitError. */
  async receive(): Promise<Result | ErrorMessage> {
    const m = this.answers.shift() ?? await new Promise<Result | ErrorMessage | Error>((resolve) => {
      const timer = setTimeout(() => resolve(new LinkError(`no answer from ${this.url} within ${this.timeout / 1000} s`)), this.timeout);
      this.waiting = (x) => { clearTimeout(timer); resolve(x); };
    });
    if (m instanceof Error) throw m instanceof SplitError ? m : new SplitError(`the server at ${this.url} sent a bad message: ${m.message}`);
    return m;
  }

  close(): void {
    this.closed ??= "closed";
    this.ws.close();
  }
}

export class RemoteVerifier implements Verifier {
  private link: Link | null = null;
  private round = 0;
  private capacity = 0;
  private limits: Result["limits"] = null;
  /** The sequence the server's session holds but its last token (after the last answer);
   * null when not known (nothing to resume). */
  private held: number[] | null = null;
  private sampled = false;
  /** Between generations keep the server's session (PAUSE) for the next turn to resume. */
  private hold = false;

  /** qIds: the most ids a drafted token's q holds (the drafter's support); null for a drafter
   * that sends no q (prompt lookup). */
  constructor(readonly options: SplitOptions, readonly maxPositions: number, readonly fingerprint: string,
    readonly qIds: number | null) {}

  private async connect(): Promise<Link> {
    if (this.link && !this.link.closed) return this.link;
    this.held = null;
    this.link = await Link.open(this.options);
    return this.link;
  }

  private fail(answer: ErrorMessage, what: string): never {
    throw new SplitError(`the server refused ${what} (${answer.code}): ${answer.text}`);
  }

  async prefill(prompt: number[], capacity: number, params: SamplingParams, _rng: Rng, _cached: number): Promise<[number, RoundStats]> {
    const start = now();
    const link = await this.connect();
    this.capacity = capacity;
    this.sampled = params.temperature > 0;
    // the server's cache is resumed from what this link knows it holds, not from `cached`
    let keep = 0;
    if (this.held) {
      const n = Math.min(this.held.length, prompt.length - 1);
      while (keep < n && this.held[keep] === prompt[keep]) keep++;
    }
    let answer = await this.start(link, prompt, keep, params);
    if (answer.kind === "error" && keep > 0 && (answer.code === GONE || answer.code === OUT_OF_SYNC)) {
      keep = 0; // evicted, or out of step: all of the prompt, on the same link
      answer = await this.start(link, prompt, 0, params);
    }
    if (answer.kind === "error") this.fail(answer, "the generation's START");
    this.limits = answer.limits ?? this.limits;
    this.held = [...prompt];
    const seconds = now() - start;
    const stats = roundStats("prefill", 1, prompt.length - keep, seconds, { verifySeconds: seconds });
    return [answer.token, stats];
  }

  private async start(link: Link, prompt: number[], keep: number, p: SamplingParams): Promise<Result | ErrorMessage> {
    const room = this.limits ? Math.min(this.capacity, this.limits.maxContext) : this.capacity;
    link.send(encodeStart({ ids: prompt.slice(keep), capacity: Math.max(room, prompt.length + 1), temperature: p.temperature,
      topP: p.topP, topK: p.topK, seed: p.seed ?? null, fingerprint: this.fingerprint, keep }, ++this.round));
    return link.receive();
  }

  /** Drafts the server's session can take after seq (-1: it can go no further), as many as a
   * VERIFY within the server's request size carries, q rows at their largest. */
  maxDrafts(seq: number[]): number {
    const context = this.limits ? Math.min(this.capacity, this.limits.maxContext) : this.capacity;
    const room = Math.max(context - seq.length, -1);
    if (!this.limits || room <= 0) return room;
    const rowIds = this.sampled ? this.qIds : null;
    const perDraft = 4 + (rowIds !== null ? 5 + 6 * rowIds : 0);
    const fits = Math.floor((this.limits.maxRequestBytes - verifySize(0, null)) / perDraft);
    return Math.min(room, Math.max(0, Math.min(MAX_DRAFTS, fits)));
  }

  async submit(seq: number[], p: Proposal, _params: SamplingParams, _rng: Rng): Promise<Verdict> {
    const start = now();
    const link = this.link;
    if (!link) throw new SplitError("no session: the generation did not START");
    const q = p.kind === "sampled" && p.tokens.length ? p.q : null;
    if (this.limits && verifySize(p.tokens.length, q ? q.map((r) => r.ids.length) : null) > this.limits.maxRequestBytes) {
      throw new SplitError(`a round of ${p.tokens.length} drafts is larger than the server's ${this.limits.maxRequestBytes}-byte requests: plan fewer drafts`);
    }
    link.send(encodeVerify(seq.length, p.tokens, q, ++this.round));
    const answer = await link.receive();
    if (answer.kind === "error") {
      this.held = null;
      this.fail(answer, `round ${this.round}`);
    }
    if (answer.accepted > p.tokens.length || answer.length !== seq.length + answer.accepted + 1) {
      this.held = null;
      throw new SplitError(`the server's answer is out of step (accepted ${answer.accepted} of ${p.tokens.length}, length ${answer.length} after ${seq.length})`);
    }
    this.held = [...seq, ...p.tokens.slice(0, answer.accepted)];
    return { accepted: answer.accepted, token: answer.token, verifySeconds: now() - start };
  }

  truncate(_length: number): void {
    // the server truncates its own cache to what it accepted
  }

  keepSession(keep: boolean): void {
    this.hold = keep;
  }

  /** The generation is over: END (the server frees its cache), or PAUSE while `hold`. */
  close(): void {
    if (!this.link || this.link.closed) return;
    if (this.hold && this.held) {
      this.link.send(encodeNotice(PAUSE, ++this.round));
    } else {
      this.held = null;
      this.link.send(encodeNotice(END, ++this.round));
    }
  }

  /** Close the WebSocket (the server ends the session). */
  disconnect(): void {
    this.link?.close();
    this.link = null;
    this.held = null;
  }
}
