/** The decode loop (`runtime/decode.py`): prefill once, then draft-verify rounds until a stop.

Every mode is this loop; plain decoding is a drafter that proposes nothing (γ = 0). A round:
  1. plan     the caller asked the policy once, for the drafter that will propose
  2. draft    the drafter proposes up to γ tokens
  3. submit   the verifier scores [last, d_1..d_γ]
  5. accept   the verdict: d_1..d_n accepted, then the target's token t
  6. truncate verifier and drafter caches to the accepted prefix (a length change, in
              `finally`, so a failing round leaves them as they were)
(Phase 4, drafting ahead while a remote verdict is in flight, belongs to split decoding, which
this package does not run yet: a local verdict is ready at once.) Greedy output equals the
target's own greedy output whatever the drafter proposes. */

import { AbortError } from "./errors.js";
import type { DraftLengthPolicy } from "./policies.js";
import { Rng, type SamplingParams } from "./sampling.js";
import { capped, now, roundStats, type Drafter, type Plan, type RoundStats, type Step, type Verifier } from "./round.js";

export async function* decode(
  verifier: Verifier, drafter: Drafter, policy: DraftLengthPolicy, prompt: number[],
  params: SamplingParams, maxNewTokens: number, stopIds: Set<number>, cached = 0, signal?: AbortSignal,
): AsyncGenerator<Step> {
  try {
    yield* decodeRounds(verifier, drafter, policy, prompt, params, maxNewTokens, stopIds, cached, signal);
  } finally {
    verifier.close?.(); // however the generation ended: done, aborted, failed
  }
}

async function* decodeRounds(
  verifier: Verifier, drafter: Drafter, policy: DraftLengthPolicy, prompt: number[],
  params: SamplingParams, maxNewTokens: number, stopIds: Set<number>, cached: number, signal?: AbortSignal,
): AsyncGenerator<Step> {
  const rng = new Rng(params.seed);
  // drafts are capped below so that the last verify writes position P + maxNew - 1
  const capacity = Math.min(prompt.length + maxNewTokens, verifier.maxPositions);
  cached = Math.min(cached, prompt.length - 1);
  checkAbort(signal);
  const [first, prefill] = await verifier.prefill(prompt, capacity, params, rng, cached);
  await drafter.begin(prompt, capacity, cached);
  const seq = [...prompt, first];
  let step: Step = { tokens: [first], stats: prefill, finishReason: null };
  let produced = 1, rounds = 0;
  for (;;) {
    step.finishReason = finishReason(step.tokens[step.tokens.length - 1], produced, maxNewTokens, stopIds, seq.length - 1, capacity);
    const most = step.finishReason ? 0 : verifier.maxDrafts(seq);
    yield step;
    if (step.finishReason) return;
    checkAbort(signal);
    // never draft past the token budget, the cache (verify writes γ + 1 positions) or the verifier
    const room = Math.min(maxNewTokens - produced - 1, capacity - seq.length);
    const source = drafter.source(seq);
    const plan = capped(policy.plan(source), Math.min(room, most));
    const [made, stats] = await speculativeRound(verifier, drafter, plan, seq, params, rng);
    rounds += 1;
    stats.source = source;
    stats.index = rounds;
    policy.observe(stats);
    const fresh = cutAtStop(made, stopIds);
    seq.push(...fresh);
    produced += fresh.length;
    step = { tokens: fresh, stats, finishReason: null };
  }
}

/** One draft-verify round after `seq`: the new tokens (accepted drafts + one) and its stats. */
export async function speculativeRound(
  verifier: Verifier, drafter: Drafter, plan: Plan, seq: number[], params: SamplingParams, rng: Rng,
): Promise<[number[], RoundStats]> {
  const start = now();
  const base = seq.length; // the caches hold seq[:-1]; this round appends from seq[-1]
  let valid = base - 1; // what stays valid in the caches if anything below throws
  try {
    // 2. draft
    const proposal = await drafter.propose(seq, plan, params, rng);
    const g = proposal.tokens.length;
    // 3. submit (a local verdict is ready at once)
    const verdict = await verifier.submit(seq, proposal, params, rng);
    // 5. accept
    const n = verdict.accepted;
    valid = base + n;
    const stats = roundStats("decode", n + 1, g + 1, now() - start, {
      drafted: g, accepted: n, draftSeconds: proposal.seconds, verifySeconds: verdict.verifySeconds,
      exitLayer: proposal.tail?.exitLayer ?? null, catchupSeconds: proposal.catchupSeconds ?? 0,
    });
    return [[...proposal.tokens.slice(0, n), verdict.token], stats];
  } finally {
    // 6. truncate the caches to seq + d_1..d_n (a length change, never a copy)
    verifier.truncate(valid);
    drafter.commit(valid);
  }
}

function cutAtStop(tokens: number[], stopIds: Set<number>): number[] {
  const i = tokens.findIndex((t) => stopIds.has(t));
  return i < 0 ? tokens : tokens.slice(0, i + 1);
}

export function finishReason(token: number, produced: number, maxNew: number, stopIds: Set<number>, length: number, capacity: number): string | null {
  if (stopIds.has(token)) return "eos";
  if (produced >= maxNew) return "length";
  if (length >= capacity) return "context";
  return null;
}

function checkAbort(signal?: AbortSignal): void {
  if (signal?.aborted) throw new AbortError("the generation was aborted (its AbortSignal fired)");
}
