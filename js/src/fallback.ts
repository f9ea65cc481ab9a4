/** Split decoding that finishes on the device when the link fails (`FallbackVerifier` of
`runtime/split/fallback.py`, without its reconnects and late rounds): the server verifies while it
answers; once a round's link fails (closed, no answer in time), that round and the rest of the
generation are verified by the bundle's own `full` graph, which first prefills the sequence
so far. The next generation starts on the server again. Greedy output is the target's either
way, so it equals `ar`'s. A refusal by the server (an ERROR answer) is not a link failure: it
ends the generation with its message, as does a server that cannot be reached at its start. */

import type { LocalVerifier } from "./local.js";
import { LinkError, type RemoteVerifier } from "./remote.js";
import type { Rng, SamplingParams } from "./sampling.js";
import type { Proposal, RoundStats, Verdict, Verifier } from "./round.js";

export class FallbackVerifier implements Verifier {
  readonly maxPositions: number;
  /** Why the current generation went on locally (null: it is on the server). */
  down: string | null = null;
  private capacity = 0;
  private ready = false; // the local cache holds the sequence but its last token

  constructor(readonly remote: RemoteVerifier, readonly local: LocalVerifier) {
    this.maxPositions = remote.maxPositions;
  }

  async prefill(prompt: number[], capacity: number, params: SamplingParams, rng: Rng, cached: number): Promise<[number, RoundStats]> {
    this.down = null;
    this.ready = false;
    this.capacity = capacity;
    return this.remote.prefill(prompt, capacity, params, rng, cached);
  }

  maxDrafts(seq: number[]): number {
    return this.down ? this.local.maxDrafts(seq) : this.remote.maxDrafts(seq);
  }

  async submit(seq: number[], p: Proposal, params: SamplingParams, rng: Rng): Promise<Verdict> {
    if (!this.down) {
      try {
        return await this.remote.submit(seq, p, params, rng);
      } catch (e) {
        if (!(e instanceof LinkError)) throw e;
        this.down = e.message;
        this.remote.disconnect(); // the next generation connects afresh
      }
    }
    if (!this.ready) {
      const target = this.local.target;
      target.reset(this.capacity);
      await target.forward(seq.slice(0, -1), 0);
      this.ready = true;
    }
    return this.local.submit(seq, p, params, rng);
  }

  truncate(length: number): void {
    if (this.down) this.local.truncate(length);
  }

  keepSession(keep: boolean): void {
    this.remote.keepSession(keep);
  }

  close(): void {
    this.remote.close();
  }

  disconnect(): void {
    this.remote.disconnect();
  }
}
