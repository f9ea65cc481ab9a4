/** numpy's `np.random.default_rng(seed)`: SeedSequence -> PCG64 (XSL-RR 128/64), and
`Generator.random()` (53-bit doubles). The Python runtime draws every sampled token from this
stream, so a seeded generation here draws the same uniforms in the same order and a sampled
generation reproduces Python's token for token (tests/test_js_conformance.py). */

const mul32 = (a: number, b: number): number => Math.imul(a, b) >>> 0;

/** numpy.random.SeedSequence(seed).generate_state(n, uint32) for a non-negative int seed. */
export function seedSequenceState(seed: number, words: number): Uint32Array {
  const INIT_A = 0x43b0d7e5, MULT_A = 0x931e8875, INIT_B = 0x8b51f9dd, MULT_B = 0x58f38ded;
  const MIX_L = 0xca01f9dd, MIX_R = 0x4973f715, POOL = 4;
  if (!(Number.isSafeInteger(seed) && seed >= 0)) throw new RangeError(`seed must be a non-negative integer, got ${seed}`);
  const entropy: number[] = [];
  for (let s = seed; ; s = Math.floor(s / 2 ** 32)) {
    entropy.push(s % 2 ** 32);
    if (s < 2 ** 32) break;
  }
  let hashA = INIT_A;
  const hashmix = (value: number): number => {
    value = (value ^ hashA) >>> 0;
    hashA = mul32(hashA, MULT_A);
    value = mul32(value, hashA);
    return (value ^ (value >>> 16)) >>> 0;
  };
  const mix = (x: number, y: number): number => {
    const r = (mul32(MIX_L, x) - mul32(MIX_R, y)) >>> 0;
    return (r ^ (r >>> 16)) >>> 0;
  };
  const pool = new Array<number>(POOL);
  for (let i = 0; i < POOL; i++) pool[i] = hashmix(i < entropy.length ? entropy[i] : 0);
  for (let src = 0; src < POOL; src++) {
    for (let dst = 0; dst < POOL; dst++) if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  }
  for (let src = POOL; src < entropy.length; src++) {
    for (let dst = 0; dst < POOL; dst++) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  }
  let hashB = INIT_B;
  const out = new Uint32Array(words);
  for (let i = 0; i < words; i++) {
    let v = (pool[i % POOL] ^ hashB) >>> 0;
    hashB = mul32(hashB, MULT_B);
    v = mul32(v, hashB);
    out[i] = (v ^ (v >>> 16)) >>> 0;
  }
  return out;
}

const MASK128 = (1n << 128n) - 1n;
const MASK64 = (1n << 64n) - 1n;
const PCG_MULT = (0x2360ed051fc65da4n << 64n) | 0x4385df649fccf645n;

export class PCG64 {
  private state = 0n;
  private inc = 0n;
  private half: number | null = null; // the high 32 bits of a 64-bit draw, not used yet

  constructor(seed: number) {
    const w = seedSequenceState(seed, 8); // four uint64, little-endian pairs of uint32
    const u64 = (i: number) => (BigInt(w[2 * i + 1]) << 32n) | BigInt(w[2 * i]);
    const initstate = (u64(0) << 64n) | u64(1);
    const initseq = (u64(2) << 64n) | u64(3);
    this.inc = ((initseq << 1n) | 1n) & MASK128;
    this.step();
    this.state = (this.state + initstate) & MASK128;
    this.step();
  }

  private step(): void {
    this.state = (this.state * PCG_MULT + this.inc) & MASK128;
  }

  nextUint64(): bigint {
    this.step();
    const s = this.state;
    const value = ((s >> 64n) ^ s) & MASK64;
    const rot = s >> 122n;
    return ((value >> rot) | (value << ((64n - rot) & 63n))) & MASK64;
  }

  /** 32 bits: the low half of a fresh 64-bit draw, then its high half (numpy's buffering). */
  nextUint32(): number {
    if (this.half !== null) {
      const h = this.half;
      this.half = null;
      return h;
    }
    const v = this.nextUint64();
    this.half = Number(v >> 32n);
    return Number(v & 0xffffffffn);
  }

  /** Generator.integers(high) for 0 < high <= 2^32: Lemire's bounded draw, as numpy. */
  integers(high: number): number {
    const excl = high; // rng + 1
    let m = BigInt(this.nextUint32()) * BigInt(excl);
    let leftover = Number(m & 0xffffffffn);
    if (leftover < excl) {
      const threshold = (0xffffffff - (excl - 1)) % excl;
      while (leftover < threshold) {
        m = BigInt(this.nextUint32()) * BigInt(excl);
        leftover = Number(m & 0xffffffffn);
      }
    }
    return Number(m >> 32n);
  }

  /** Generator.random(): (next_uint64 >> 11) * 2^-53. */
  random(): number {
    return Number(this.nextUint64() >> 11n) / 9007199254740992;
  }
}

