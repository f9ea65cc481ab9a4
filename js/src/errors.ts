/** Errors an app can catch by kind: each message says what is wrong and what to do. */

export class EdgespecError extends Error {
  override name = "EdgespecError";
}

/** A bundle is missing, malformed or incompatible. */
export class BundleError extends EdgespecError {
  override name = "BundleError";
}

/** A request the runtime refuses (empty prompt, bad option, ...). */
export class InputError extends EdgespecError {
  override name = "InputError";
}

/** The generation was cancelled through its AbortSignal. */
export class AbortError extends EdgespecError {
  override name = "AbortError";
}
