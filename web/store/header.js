// A GGUF file's header, read from its first bytes: the one loop that grows a prefix until Python's
// probe (pyshim/plan/probe.py, through the Worker) can parse it. The header's length is not known in
// advance (a 262k-token vocabulary is ~6 MB of it), so the probe answers {need: n} while the prefix ends
// inside it; each round asks for at least that, and at least twice the last prefix.
//
// Used for a model on the network before it downloads (engine/worker.js "read-header"), and for the
// "will it fit?" gate of a download (store/download.js), whose prefix comes from the stored chunks.

import { StoreError } from "./errors.js";

export const FIRST_PREFIX = 1 << 20;   // most headers fit
const MAX_ROUNDS = 8;

// readPrefix(length) -> Uint8Array of the first `length` bytes (fewer at the end of the file);
// probe(bytes) -> {need} or an answer. Returns {bytes, answer, rounds}. A file that ends inside its
// header, or whose header never ends, throws a StoreError marked `refusal` (the file's own fault).
export async function growHeader(readPrefix, size, probe, { first = FIRST_PREFIX } = {}) {
  let length = size ? Math.min(size, first) : first;
  for (let round = 1; round <= MAX_ROUNDS; round++) {
    const bytes = await readPrefix(length);
    const answer = await probe(bytes);
    if (answer.need === undefined) return { bytes, answer, rounds: round };
    if (bytes.length < length || (size && bytes.length >= size)) {
      throw Object.assign(new StoreError("TruncatedError", "the file ends inside its GGUF header", "the file is incomplete: get it again"), { refusal: true });
    }
    length = Math.max(answer.need, 2 * length);
    if (size) length = Math.min(size, length);
  }
  throw Object.assign(new StoreError("GGUFFormatError", "the GGUF header is implausibly large"), { refusal: true });
}
