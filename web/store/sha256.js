// Incremental SHA-256 (FIPS 180-4) for whole-file checks. crypto.subtle.digest only hashes one buffer
// at once, and a model of several GB never sits in memory whole, so the file is fed chunk by chunk.
// Per-chunk hashes use crypto.subtle (native, faster); this is for the streaming whole-file digest.

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const INITIAL = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

export class Sha256 {
  #h = new Int32Array(INITIAL);
  #w = new Int32Array(64);
  #block = new Uint8Array(64);  // a partial block carried between update() calls
  #blockLen = 0;
  #bytes = 0;                   // total length fed (a Number is exact up to 2^53 bytes)

  update(data) {
    let pos = 0;
    this.#bytes += data.length;
    if (this.#blockLen) {
      const take = Math.min(64 - this.#blockLen, data.length);
      this.#block.set(data.subarray(0, take), this.#blockLen);
      this.#blockLen += take;
      pos = take;
      if (this.#blockLen < 64) return this;
      this.#compress(new DataView(this.#block.buffer), 0);
      this.#blockLen = 0;
    }
    const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    for (; pos + 64 <= data.length; pos += 64) this.#compress(view, pos);
    this.#block.set(data.subarray(pos));
    this.#blockLen = data.length - pos;
    return this;
  }

  hex() {
    const bits = this.#bytes * 8;
    const tail = new Uint8Array(((this.#blockLen + 8) >> 6 << 6) + 64);
    tail.set(this.#block.subarray(0, this.#blockLen));
    tail[this.#blockLen] = 0x80;
    const view = new DataView(tail.buffer);
    view.setUint32(tail.length - 8, Math.floor(bits / 2 ** 32));
    view.setUint32(tail.length - 4, bits >>> 0);
    for (let pos = 0; pos < tail.length; pos += 64) this.#compress(view, pos);
    return Array.from(this.#h, (x) => (x >>> 0).toString(16).padStart(8, "0")).join("");
  }

  #compress(view, at) {
    // Plain locals and Int32Array arithmetic: this loop is the whole cost of hashing a file.
    const w = this.#w, h = this.#h;
    for (let i = 0; i < 16; i++) w[i] = view.getInt32(at + 4 * i);
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15], y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (k + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h[0] = (h[0] + a) | 0; h[1] = (h[1] + b) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
    h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + k) | 0;
  }
}

export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (x) => x.toString(16).padStart(2, "0")).join("");
}
