/** The split-decoding wire format (`edgespec/protocol.py`, version 4), the device's side:
binary messages, one per WebSocket frame, a 12-byte little-endian header
(magic "ES" | version u8 | type u8 | session u32 | round u32) then a type's body.

The device sends START (a generation's prompt, or on resume the ids after the `keep` positions
the server's session still holds), VERIFY (drafts after `base` committed tokens, with the q
each sampled draft was drawn from as a sparse support), END and PAUSE; it reads RESULT
(accepted drafts, the next token, the server's committed length) and ERROR. `decodeAnswer`
refuses anything malformed with a `ProtocolError` naming the problem. */

import { EdgespecError } from "./errors.js";
import type { SparseQ } from "./draftq.js";

export const VERSION = 4;
export const SUBPROTOCOL = "edgespec.limits"; // the server's limits come in START's RESULT
export const MAX_DRAFTS = 64;
export const START = 1, VERIFY = 2, RESULT = 3, ERROR = 4, END = 5, PAUSE = 6;
const NAMES = ["", "START", "VERIFY", "RESULT", "ERROR", "END", "PAUSE", "STREAM", "TOKENS", "STOP"];
const SAMPLING = 1, HAS_SEED = 2;
const ROW_SUPPORT = 3;
// error codes the device acts on (`edgespec/wire.py`)
export const GONE = 410, OUT_OF_SYNC = 409;

export class ProtocolError extends EdgespecError {
  override name = "ProtocolError";
}

export interface Start {
  ids: number[];
  capacity: number;
  temperature: number;
  topP: number;
  topK: number;
  seed: number | null;
  fingerprint: string;
  keep: number;
}

export interface Result {
  kind: "result";
  accepted: number;
  token: number;
  length: number; // committed tokens on the server after this round
  serverSeconds: number;
  // the server's limits and its streaming offer (tokens/s of its recent streams, how many it
  // would start now), in the answer to a START only
  limits: { maxContext: number; maxRequestBytes: number; streamRate: number; streamRoom: number } | null;
  round: number;
}

export interface ErrorMessage {
  kind: "error";
  code: number;
  text: string;
  round: number;
}

class Writer {
  private bytes: number[] = [];
  private view = new DataView(new ArrayBuffer(8));
  private put(n: number): void {
    for (let i = 0; i < n; i++) this.bytes.push(this.view.getUint8(i));
  }
  u8(v: number): this { this.bytes.push(v & 0xff); return this; }
  u16(v: number): this { this.view.setUint16(0, v, true); this.put(2); return this; }
  u32(v: number): this { this.view.setUint32(0, v, true); this.put(4); return this; }
  i32(v: number): this { this.view.setInt32(0, v, true); this.put(4); return this; }
  f32(v: number): this { this.view.setFloat32(0, v, true); this.put(4); return this; }
  u64(v: number): this { this.view.setBigUint64(0, BigInt(v), true); this.put(8); return this; }
  raw(b: Uint8Array): this { for (const x of b) this.bytes.push(x); return this; }
  ids(ids: ArrayLike<number>): this {
    this.u32(ids.length);
    for (let i = 0; i < ids.length; i++) this.i32(ids[i]);
    return this;
  }
  done(): Uint8Array { return Uint8Array.from(this.bytes); }
}

function header(kind: number, session: number, round: number): Writer {
  return new Writer().u8(0x45).u8(0x53).u8(VERSION).u8(kind).u32(session).u32(round);
}

export function encodeStart(m: Start, round: number): Uint8Array {
  const sampled = m.temperature > 0;
  const flags = (sampled ? SAMPLING : 0) | (m.seed !== null ? HAS_SEED : 0);
  const fingerprint = new TextEncoder().encode(m.fingerprint).slice(0, 256);
  return header(START, 0, round)
    .u8(flags).u32(m.topK).f32(m.temperature).f32(m.topP).u64(m.seed ?? 0).u32(m.capacity).u32(m.keep)
    .u16(fingerprint.length).raw(fingerprint)
    .ids(m.ids)
    .done();
}

export function encodeVerify(base: number, drafts: number[], q: SparseQ[] | null, round: number): Uint8Array {
  const w = header(VERIFY, 0, round).u32(base).u8(q ? 1 : 0).ids(drafts);
  for (const row of q ?? []) {
    w.u8(ROW_SUPPORT).u32(row.ids.length);
    for (const id of row.ids) w.i32(id);
    for (const c of row.counts) w.u16(c);
  }
  return w.done();
}

/** Bytes of a VERIFY with `drafts` drafts and q rows of these support sizes (`verify_size`). */
export function verifySize(drafts: number, supportSizes: number[] | null): number {
  const rows = (supportSizes ?? []).reduce((s, n) => s + 5 + 6 * n, 0);
  return 12 + 5 + 4 + 4 * drafts + rows;
}

export function encodeNotice(kind: typeof END | typeof PAUSE, round: number): Uint8Array {
  return header(kind, 0, round).done();
}

/** A server's answer: RESULT or ERROR (the device sends no STREAM, so reads no TOKENS). */
export function decodeAnswer(data: ArrayBuffer | Uint8Array | string): Result | ErrorMessage {
  if (typeof data === "string") throw new ProtocolError("text frame received: this protocol uses binary frames only");
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 12) throw new ProtocolError(`message of ${bytes.length} bytes is shorter than the 12-byte header`);
  if (bytes[0] !== 0x45 || bytes[1] !== 0x53) throw new ProtocolError("bad magic: not an edgespec split-decoding message");
  if (bytes[2] !== VERSION) {
    throw new ProtocolError(`protocol version ${bytes[2]} is not supported (this side speaks ${VERSION}): use the same edgespec version on device and server`);
  }
  const kind = bytes[3], round = view.getUint32(8, true);
  const need = (n: number, what: string) => {
    if (bytes.length < n) throw new ProtocolError(`${NAMES[kind] ?? kind}: truncated ${what}`);
  };
  if (kind === RESULT) {
    need(26, "fields");
    const limits = bytes.length === 40 ? { maxContext: view.getUint32(26, true), maxRequestBytes: view.getUint32(30, true),
      streamRate: view.getFloat32(34, true), streamRoom: view.getUint16(38, true) } : null;
    if (bytes.length !== 26 && bytes.length !== 40) throw new ProtocolError(`RESULT of ${bytes.length} bytes: expected 26 or 40`);
    return { kind: "result", accepted: view.getUint16(12, true), token: view.getInt32(14, true),
      length: view.getUint32(18, true), serverSeconds: view.getFloat32(22, true), limits, round };
  }
  if (kind === ERROR) {
    need(16, "code and text length");
    const n = view.getUint16(14, true);
    need(16 + n, "text");
    return { kind: "error", code: view.getUint16(12, true), text: new TextDecoder().decode(bytes.subarray(16, 16 + n)), round };
  }
  throw new ProtocolError(`the server sent ${NAMES[kind] ?? `message type ${kind}`}, which a verifying device does not expect`);
}
