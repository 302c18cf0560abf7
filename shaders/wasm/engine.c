// pyshim's CPU engine: the kernels of a forward pass in C, built to WebAssembly with SIMD128
// (`pyshim setup`: zig cc, target wasm32-wasi as a reactor: no imports, only its memory).
//
// Python records a forward pass once per step shape as a program: an array of ops of OP_WORDS words
// each (an opcode, then pointers into this module's memory, sizes, and floats as their bits),
// the same recording the GPU executor makes of its dispatches. `run` executes a program in one call,
// so a step costs one crossing from Python (or from the page's JS) into this module.
//
// The arithmetic is the GPU int8 route's, itself llama.cpp's CPU rounding: a quantized matmul rounds
// its activations to int8 blocks first (Q8_0 blocks of 32 against Q4_0/Q5_0/Q8_0, Q8_1 against Q4_1,
// Q8_K blocks of 256 against the k-quants, f16 against F16), multiplies integers, and scales per block.
// pyshim.exec.llama_cpp.Int8Ops is its oracle; sums run in another order, so results agree to float
// rounding, not bit for bit.

// The 64-bit build (wasm64, memory64: models past wasm32's 4 GiB, where the browser has it) is the same
// source for target wasm64-freestanding: wasi-libc is built for wasm32 only, so there the C library's few
// parts come from the compiler (memcpy, rintf... as builtins: single instructions), zig's compiler_rt
// (expf, sin, cos: the very functions the wasm32 build links) and libm64.zig (tanhf: zig's, as the
// wasm32 build's). Pointers are 64-bit there, and so are a program's words (Word below).
#include <stdint.h>
#include <wasm_simd128.h>
#ifdef __wasm64__
#include <stddef.h>
#define memcpy __builtin_memcpy
#define memset __builtin_memset
#define rintf __builtin_rintf
#define fabsf __builtin_fabsf
#define fmaxf __builtin_fmaxf
#define fminf __builtin_fminf
#define floorf __builtin_floorf
#define sqrt __builtin_sqrt
#define INFINITY __builtin_inff()
float expf(float);
float tanhf(float);
double sin(double);
double cos(double);
#else
#include <math.h>
#include <string.h>
#endif

#define EXPORT(name) __attribute__((export_name(#name)))

// ------------------------------------------------------------------ memory

extern unsigned char __heap_base;
static uintptr_t heap_top = 0;

// Bytes from the top of the heap, 64-aligned, growing the memory as needed; 0 when it cannot grow.
// Nothing is freed: Python allocates weights, caches and arenas once and reuses them.
EXPORT(alloc) uintptr_t alloc(uintptr_t nbytes) {
    if (!heap_top) heap_top = (uintptr_t)&__heap_base;
    uintptr_t at = (heap_top + 63) & ~(uintptr_t)63;
    uint64_t end = (uint64_t)at + nbytes;
    uint64_t have = (uint64_t)__builtin_wasm_memory_size(0) * 65536;
    if (end > (uint64_t)UINTPTR_MAX) return 0;      // (past wasm32's 4 GiB: its memory cannot reach there)
    if (end > have) {
        uint64_t pages = (end - have + 65535) / 65536;
        if (__builtin_wasm_memory_grow(0, (uintptr_t)pages) == (uintptr_t)-1) return 0;
    }
    heap_top = (uintptr_t)end;
    return at;
}

EXPORT(heap_used) uintptr_t heap_used(void) { return heap_top ? heap_top : (uintptr_t)&__heap_base; }

#ifdef __wasm64__
// (wasm32-wasi's reactor model exports this to run the C library's constructors; here there are none,
// and the hosts call it all the same)
EXPORT(_initialize) void initialize(void) {}
#endif

// ------------------------------------------------------------------ threads
//
// The threaded build (`pyshim-cpu-mt.wasm`: atomics, a shared memory the page imports) runs a program
// on several Web Workers at once: each calls the same ops with its thread index `tid` of `nth`, each op
// does its share (a matmul's rows, attention's heads; thread 0 alone the cheap ops) and every op ends
// in a barrier. The single-threaded build compiles the same code with nth = 1 and no waiting.

#ifdef __wasm_atomics__
#define SPINS 200000        // checks before sleeping in a wait (~0.1 ms): waking a sleeper costs more than that
static volatile int32_t bar_count = 0, bar_gen = 0;

static void barrier(int nth) {
    if (nth == 1) return;
    int32_t gen = __atomic_load_n(&bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_fetch_add(&bar_count, 1, __ATOMIC_ACQ_REL) == nth - 1) {
        __atomic_store_n(&bar_count, 0, __ATOMIC_RELAXED);
        __atomic_fetch_add(&bar_gen, 1, __ATOMIC_RELEASE);
        __builtin_wasm_memory_atomic_notify((int *)&bar_gen, 0xffffffffu);
        return;
    }
    for (int spin = 0; spin < SPINS; spin++)
        if (__atomic_load_n(&bar_gen, __ATOMIC_ACQUIRE) != gen) return;
    while (__atomic_load_n(&bar_gen, __ATOMIC_ACQUIRE) == gen)
        __builtin_wasm_memory_atomic_wait32((int *)&bar_gen, gen, -1);
}
#else
static void barrier(int nth) { (void)nth; }
#endif

// [lo, hi) of `total` items for thread tid of nth
static inline int share_lo(int total, int tid, int nth) { return (int)((int64_t)total * tid / nth); }

// ------------------------------------------------------------------ helpers

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) { bits = sign; }
        else {                                    // subnormal: normalize
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) { bits = sign | 0x7f800000 | (man << 13); }
    else { bits = sign | ((exp + 127 - 15) << 23) | (man << 13); }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// f32 -> f16 bits, rounded to nearest even (as NumPy's astype(float16) and F16C do)
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0));
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);            // rounds past 65504: infinity
    if (ax < 0x38800000) {                                               // below f16's smallest normal
        float a;
        memcpy(&a, &ax, 4);
        // a * 2^24 is the subnormal's integer mantissa; rintf rounds half to even
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    uint32_t man = ax & 0x7fffff, exp = (ax >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

static inline uint16_t load_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static inline float hsum_f32x4(v128_t v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

static inline int32_t hsum_i32x4(v128_t v) {
    return wasm_i32x4_extract_lane(v, 0) + wasm_i32x4_extract_lane(v, 1) + wasm_i32x4_extract_lane(v, 2) +
           wasm_i32x4_extract_lane(v, 3);
}

static float dot_f32(const float *a, const float *b, int n) {
    v128_t acc0 = wasm_f32x4_splat(0.0f), acc1 = wasm_f32x4_splat(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = wasm_f32x4_add(acc0, wasm_f32x4_mul(wasm_v128_load(a + i), wasm_v128_load(b + i)));
        acc1 = wasm_f32x4_add(acc1, wasm_f32x4_mul(wasm_v128_load(a + i + 4), wasm_v128_load(b + i + 4)));
    }
    float s = hsum_f32x4(wasm_f32x4_add(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// ------------------------------------------------------------------ weight types (GGUF numbers)

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };

static int block_values(int t) { return t == T_F32 || t == T_F16 ? 1 : (t >= T_Q4_K ? 256 : 32); }
static int block_bytes(int t) {
    switch (t) {
    case T_F32: return 4;   case T_F16: return 2;   case T_Q4_0: return 18;  case T_Q4_1: return 20;
    case T_Q5_0: return 22; case T_Q8_0: return 34; case T_Q4_K: return 144; case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    }
    return 0;
}

EXPORT(row_bytes) uint32_t row_bytes(int t, int k) { return (uint32_t)(k / block_values(t) * block_bytes(t)); }

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4)
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

// One row of `k` values of type t, dequantized to f32 (embedding lookups and the f32 route).
static void dequant_row(int t, const uint8_t *w, float *y, int k) {
    switch (t) {
    case T_F32: memcpy(y, w, (size_t)k * 4); return;
    case T_F16: for (int i = 0; i < k; i++) y[i] = f16_to_f32(load_u16(w + 2 * i)); return;
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q8_0:
        for (int b = 0; b < k / 32; b++, y += 32) {
            const uint8_t *p = w + b * block_bytes(t);
            float d = f16_to_f32(load_u16(p));
            if (t == T_Q8_0) { for (int j = 0; j < 32; j++) y[j] = d * (int8_t)p[2 + j]; continue; }
            if (t == T_Q4_1) {
                float m = f16_to_f32(load_u16(p + 2));
                for (int j = 0; j < 16; j++) { y[j] = d * (p[4 + j] & 0xF) + m; y[j + 16] = d * (p[4 + j] >> 4) + m; }
                continue;
            }
            if (t == T_Q4_0) {
                for (int j = 0; j < 16; j++) { y[j] = d * ((p[2 + j] & 0xF) - 8); y[j + 16] = d * ((p[2 + j] >> 4) - 8); }
                continue;
            }
            uint32_t qh;
            memcpy(&qh, p + 2, 4);
            for (int j = 0; j < 16; j++) {
                int lo = (p[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10), hi = (p[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
                y[j] = d * (lo - 16);
                y[j + 16] = d * (hi - 16);
            }
        }
        return;
    case T_Q4_K: case T_Q5_K:
        for (int b = 0; b < k / 256; b++) {
            const uint8_t *p = w + b * block_bytes(t);
            float d = f16_to_f32(load_u16(p)), dmin = f16_to_f32(load_u16(p + 2));
            const uint8_t *sc = p + 4, *qh = p + 16, *qs = p + (t == T_Q5_K ? 48 : 16);
            for (int j = 0; j < 4; j++, y += 64, qs += 32) {
                int s1, m1, s2, m2;
                scale_min_k4(2 * j, sc, &s1, &m1);
                scale_min_k4(2 * j + 1, sc, &s2, &m2);
                for (int l = 0; l < 32; l++) {
                    int h1 = t == T_Q5_K ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
                    int h2 = t == T_Q5_K ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
                    y[l] = d * s1 * ((qs[l] & 0xF) + h1) - dmin * m1;
                    y[l + 32] = d * s2 * ((qs[l] >> 4) + h2) - dmin * m2;
                }
            }
        }
        return;
    case T_Q6_K:
        for (int b = 0; b < k / 256; b++) {
            const uint8_t *p = w + b * 210, *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = f16_to_f32(load_u16(p + 208));
            for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    y[l] = d * sc[is] * (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                    y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    y[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    y[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
        return;
    }
}

// ------------------------------------------------------------------ activations rounded to int8

// Q8_0 / Q8_1 blocks of 32: int8 values, the scale rounded to f16 (as f32), and for Q8_1 the f16 of
// d * sum(q) (llama.cpp multiplies a Q4_1 block's min by that, not by the exact sum); `sum` itself for
// the relaxed build, whose dot products take the weights' unsigned levels and subtract their offset times it.
typedef struct { float d, s; int32_t sum; } Q8Meta;

static void quantize_q8_0(const float *x, int k, int8_t *q, Q8Meta *meta) {
    for (int b = 0; b < k / 32; b++, x += 32, q += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, inv = amax == 0.0f ? 0.0f : 127.0f / amax;
        int sum = 0;
        for (int j = 0; j < 32; j++) { q[j] = (int8_t)rintf(x[j] * inv); sum += q[j]; }
        meta[b].d = round_f16(d);
        meta[b].s = round_f16(d * (float)sum);
        meta[b].sum = sum;
    }
}

// Q8_K blocks of 256: scale so that the largest magnitude becomes -127 (ggml's quantize_row_q8_K),
// the scale kept in f32, and each 16 values' sum (the k-quants' mins multiply them).
typedef struct { float d; int16_t bsums[16]; } Q8KMeta;

static void quantize_q8_k(const float *x, int k, int8_t *q, Q8KMeta *meta) {
    for (int b = 0; b < k / 256; b++, x += 256, q += 256) {
        float amax = 0.0f, biggest = 0.0f;
        for (int j = 0; j < 256; j++) if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); biggest = x[j]; }
        if (amax == 0.0f) {
            memset(q, 0, 256);
            memset(&meta[b], 0, sizeof(Q8KMeta));
            continue;
        }
        float iscale = -127.0f / biggest;
        for (int j = 0; j < 256; j++) {
            float v = rintf(iscale * x[j]);
            q[j] = (int8_t)(v > 127.0f ? 127.0f : v);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += q[16 * g + j];
            meta[b].bsums[g] = (int16_t)s;
        }
        meta[b].d = 1.0f / iscale;
    }
}

// ------------------------------------------------------------------ dot products of one weight row

// Each kernel takes one weight row against up to TOKENS tokens' rounded activations (token j's at
// q + j * k, its block factors at meta + j * blocks): a block is unpacked once for all of them, which is
// what makes a prompt's step cheaper per token than decoding. Integer sums stay integer per block (or
// per super-block for the k-quants) and are scaled into f32x4 lanes; one horizontal sum per token ends.
#define TOKENS 4

#ifdef __wasm_relaxed_simd__
// x (int8 lanes) . u (lanes in [0, 128)) into acc's i32 lanes, four products a lane: one instruction where
// the CPU has it. Exact for such u on every CPU (the relaxed part is only what a u >= 128 would give),
// so the relaxed build's integer sums are the plain build's.
#define DOT_U(x, u, acc) wasm_i32x4_relaxed_dot_i8x16_i7x16_add((x), (u), (acc))
#endif

// Q4_0 / Q4_1 / Q5_0 / Q8_0 row . Q8_0-rounded activations
// (inlined at each call with its type a constant: the type's branches leave the inner loops)
static inline __attribute__((always_inline)) void dot_q8_0_family(int t, const uint8_t *w, const int8_t *q, const Q8Meta *meta, int k, int nt,
                                                                  int per_token, float *out) {
    v128_t acc[TOKENS];
    float mins[TOKENS];
    for (int j = 0; j < nt; j++) { acc[j] = wasm_f32x4_splat(0.0f); mins[j] = 0.0f; }
    const v128_t low4 = wasm_i8x16_splat(0x0F);
    int bb = block_bytes(t), nb = k / 32;
    for (int b = 0; b < nb; b++, w += bb) {
        v128_t lo, hi;              // the block's 32 levels, unsigned (0..15 or 0..31) but for Q8_0's
        float d = f16_to_f32(load_u16(w)), m = 0.0f;
        int off = 0;                // what the levels stand for: level - off
        if (t == T_Q8_0) {
            lo = wasm_v128_load(w + 2);
            hi = wasm_v128_load(w + 18);
        } else if (t == T_Q5_0) {
            uint32_t qh;
            memcpy(&qh, w + 2, 4);
            // bit i of qh is value i's fifth bit: spread each of 16 bits to a byte's bit 4
            const v128_t sel = wasm_i8x16_const(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
            v128_t hl = wasm_i8x16_make(qh, qh, qh, qh, qh, qh, qh, qh, qh >> 8, qh >> 8, qh >> 8, qh >> 8, qh >> 8, qh >> 8, qh >> 8, qh >> 8);
            v128_t hh = wasm_i8x16_make(qh >> 16, qh >> 16, qh >> 16, qh >> 16, qh >> 16, qh >> 16, qh >> 16, qh >> 16,
                                        qh >> 24, qh >> 24, qh >> 24, qh >> 24, qh >> 24, qh >> 24, qh >> 24, qh >> 24);
            v128_t bit = wasm_i8x16_splat(0x10);
            hl = wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(hl, sel), sel), bit);
            hh = wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(hh, sel), sel), bit);
            v128_t packed = wasm_v128_load(w + 6);
            lo = wasm_v128_or(wasm_v128_and(packed, low4), hl);
            hi = wasm_v128_or(wasm_u8x16_shr(packed, 4), hh);
            off = 16;
        } else {
            v128_t packed = wasm_v128_load(w + (t == T_Q4_1 ? 4 : 2));
            lo = wasm_v128_and(packed, low4);
            hi = wasm_u8x16_shr(packed, 4);
            if (t == T_Q4_0) off = 8;
            else m = f16_to_f32(load_u16(w + 2));
        }
#ifdef __wasm_relaxed_simd__
        // Q8_0's levels are signed: their magnitudes against the activations with the levels' signs (the
        // activations are within +-127, so negating one is exact); a level of -128, which llama.cpp never
        // writes, has no magnitude below 128: such a block takes the plain route below. For one token the
        // signs cost more than they save (measured in Chromium: 0.8x), so decoding takes it too — and so
        // does a batched decode step (`per_token`), whose tokens must each get what they get alone: the
        // two routes sum the same integers in other lanes, which the float sums round differently.
        v128_t slo = wasm_i32x4_splat(0), shi = slo;
        int relaxed = t != T_Q8_0 || (nt > 1 && !per_token);
        if (t == T_Q8_0 && relaxed) {
            const v128_t min8 = wasm_i8x16_splat(-128);
            relaxed = !wasm_v128_any_true(wasm_v128_or(wasm_i8x16_eq(lo, min8), wasm_i8x16_eq(hi, min8)));
            slo = wasm_i8x16_shr(lo, 7);
            shi = wasm_i8x16_shr(hi, 7);
        }
        if (relaxed) {
            v128_t ulo = t == T_Q8_0 ? wasm_i8x16_abs(lo) : lo, uhi = t == T_Q8_0 ? wasm_i8x16_abs(hi) : hi;
            for (int j = 0; j < nt; j++) {
                const int8_t *x = q + (size_t)j * k + 32 * b;
                const Q8Meta *mj = meta + (size_t)j * nb + b;
                v128_t xa = wasm_v128_load(x), xb = wasm_v128_load(x + 16);
                if (t == T_Q8_0) {      // (x ^ s) - s: -x where s = -1
                    xa = wasm_i8x16_sub(wasm_v128_xor(xa, slo), slo);
                    xb = wasm_i8x16_sub(wasm_v128_xor(xb, shi), shi);
                }
                v128_t isum = DOT_U(xa, ulo, DOT_U(xb, uhi, wasm_i32x4_splat(0)));
                if (off) isum = wasm_i32x4_sub(isum, wasm_i32x4_make(off * mj->sum, 0, 0, 0));
                acc[j] = wasm_f32x4_add(acc[j], wasm_f32x4_mul(wasm_f32x4_convert_i32x4(isum), wasm_f32x4_splat(d * mj->d)));
                if (t == T_Q4_1) mins[j] += m * mj->s;
            }
            continue;
        }
#endif
        if (off) { lo = wasm_i8x16_sub(lo, wasm_i8x16_splat(off)); hi = wasm_i8x16_sub(hi, wasm_i8x16_splat(off)); }
        // int16 lanes once per block: each token's dot is then 4 i32x4.dot_i16x8
        v128_t l0 = wasm_i16x8_extend_low_i8x16(lo), l1 = wasm_i16x8_extend_high_i8x16(lo);
        v128_t h0 = wasm_i16x8_extend_low_i8x16(hi), h1 = wasm_i16x8_extend_high_i8x16(hi);
        for (int j = 0; j < nt; j++) {
            const int8_t *x = q + (size_t)j * k + 32 * b;
            const Q8Meta *mj = meta + (size_t)j * nb + b;
            v128_t xa = wasm_v128_load(x), xb = wasm_v128_load(x + 16);
            v128_t isum = wasm_i32x4_add(
                wasm_i32x4_add(wasm_i32x4_dot_i16x8(l0, wasm_i16x8_extend_low_i8x16(xa)), wasm_i32x4_dot_i16x8(l1, wasm_i16x8_extend_high_i8x16(xa))),
                wasm_i32x4_add(wasm_i32x4_dot_i16x8(h0, wasm_i16x8_extend_low_i8x16(xb)), wasm_i32x4_dot_i16x8(h1, wasm_i16x8_extend_high_i8x16(xb))));
            acc[j] = wasm_f32x4_add(acc[j], wasm_f32x4_mul(wasm_f32x4_convert_i32x4(isum), wasm_f32x4_splat(d * mj->d)));
            if (t == T_Q4_1) mins[j] += m * mj->s;
        }
    }
    for (int j = 0; j < nt; j++) out[j] = hsum_f32x4(acc[j]) + mins[j];
}

// Q4_K / Q5_K row . Q8_K-rounded activations
static inline __attribute__((always_inline)) void dot_q45_k(int t, const uint8_t *w, const int8_t *q, const Q8KMeta *meta, int k, int nt, float *out) {
    float total[TOKENS] = {0};
    const v128_t low4 = wasm_i8x16_splat(0x0F), one = wasm_i8x16_splat(1);
    int bb = block_bytes(t), nb = k / 256;
    for (int b = 0; b < nb; b++, w += bb) {
        float d = f16_to_f32(load_u16(w)), dmin = f16_to_f32(load_u16(w + 2));
        const uint8_t *sc = w + 4, *qh = w + 16, *qs = w + (t == T_Q5_K ? 48 : 16);
        v128_t isum[TOKENS];
        int32_t summ[TOKENS];
        for (int j = 0; j < nt; j++) { isum[j] = wasm_i32x4_splat(0); summ[j] = 0; }
        for (int c = 0; c < 4; c++, qs += 32) {
            int s1, m1, s2, m2;
            scale_min_k4(2 * c, sc, &s1, &m1);
            scale_min_k4(2 * c + 1, sc, &s2, &m2);
            v128_t p0 = wasm_v128_load(qs), p1 = wasm_v128_load(qs + 16);
            v128_t a0 = wasm_v128_and(p0, low4), a1 = wasm_v128_and(p1, low4);
            v128_t b0 = wasm_u8x16_shr(p0, 4), b1 = wasm_u8x16_shr(p1, 4);
            if (t == T_Q5_K) {
                v128_t q0 = wasm_v128_load(qh), q1 = wasm_v128_load(qh + 16);
                a0 = wasm_v128_or(a0, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(q0, 2 * c), one), 4));
                a1 = wasm_v128_or(a1, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(q1, 2 * c), one), 4));
                b0 = wasm_v128_or(b0, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(q0, 2 * c + 1), one), 4));
                b1 = wasm_v128_or(b1, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(q1, 2 * c + 1), one), 4));
            }
#ifdef __wasm_relaxed_simd__
            for (int j = 0; j < nt; j++) {
                const int8_t *x = q + (size_t)j * k + 256 * b + 64 * c;
                v128_t s = wasm_i32x4_mul(DOT_U(wasm_v128_load(x), a0, DOT_U(wasm_v128_load(x + 16), a1, wasm_i32x4_splat(0))),
                                          wasm_i32x4_splat(s1));
                s = wasm_i32x4_add(s, wasm_i32x4_mul(DOT_U(wasm_v128_load(x + 32), b0, DOT_U(wasm_v128_load(x + 48), b1, wasm_i32x4_splat(0))),
                                                     wasm_i32x4_splat(s2)));
                isum[j] = wasm_i32x4_add(isum[j], s);
                const int16_t *bs = meta[(size_t)j * nb + b].bsums + 4 * c;
                summ[j] += m1 * (bs[0] + bs[1]) + m2 * (bs[2] + bs[3]);
            }
            continue;
#endif
            // the sub-block scales folded into the int16 weights (6-bit scale x 5-bit value < 2^11)
            v128_t k1 = wasm_i16x8_splat(s1), k2 = wasm_i16x8_splat(s2);
            v128_t a0l = wasm_i16x8_mul(wasm_u16x8_extend_low_u8x16(a0), k1), a0h = wasm_i16x8_mul(wasm_u16x8_extend_high_u8x16(a0), k1);
            v128_t a1l = wasm_i16x8_mul(wasm_u16x8_extend_low_u8x16(a1), k1), a1h = wasm_i16x8_mul(wasm_u16x8_extend_high_u8x16(a1), k1);
            v128_t b0l = wasm_i16x8_mul(wasm_u16x8_extend_low_u8x16(b0), k2), b0h = wasm_i16x8_mul(wasm_u16x8_extend_high_u8x16(b0), k2);
            v128_t b1l = wasm_i16x8_mul(wasm_u16x8_extend_low_u8x16(b1), k2), b1h = wasm_i16x8_mul(wasm_u16x8_extend_high_u8x16(b1), k2);
            for (int j = 0; j < nt; j++) {
                const int8_t *x = q + (size_t)j * k + 256 * b + 64 * c;
                v128_t x0 = wasm_v128_load(x), x1 = wasm_v128_load(x + 16), x2 = wasm_v128_load(x + 32), x3 = wasm_v128_load(x + 48);
                v128_t s = wasm_i32x4_dot_i16x8(a0l, wasm_i16x8_extend_low_i8x16(x0));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(a0h, wasm_i16x8_extend_high_i8x16(x0)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(a1l, wasm_i16x8_extend_low_i8x16(x1)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(a1h, wasm_i16x8_extend_high_i8x16(x1)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(b0l, wasm_i16x8_extend_low_i8x16(x2)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(b0h, wasm_i16x8_extend_high_i8x16(x2)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(b1l, wasm_i16x8_extend_low_i8x16(x3)));
                s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(b1h, wasm_i16x8_extend_high_i8x16(x3)));
                isum[j] = wasm_i32x4_add(isum[j], s);
                const int16_t *bs = meta[(size_t)j * nb + b].bsums + 4 * c;
                summ[j] += m1 * (bs[0] + bs[1]) + m2 * (bs[2] + bs[3]);
            }
        }
        for (int j = 0; j < nt; j++) {
            float dx = meta[(size_t)j * nb + b].d;
            total[j] += d * dx * (float)hsum_i32x4(isum[j]) - dmin * dx * (float)summ[j];
        }
    }
    for (int j = 0; j < nt; j++) out[j] = total[j];
}

// Q6_K row . Q8_K-rounded activations
static void dot_q6_k(const uint8_t *w, const int8_t *q, const Q8KMeta *meta, int k, int nt, float *out) {
    float total[TOKENS] = {0};
    const v128_t low4 = wasm_i8x16_splat(0x0F), three = wasm_i8x16_splat(3), m32 = wasm_i8x16_splat(32);
    int nb = k / 256;
    for (int b = 0; b < nb; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        float d = f16_to_f32(load_u16(w + 208));
        v128_t isum[TOKENS];
        int32_t offs[TOKENS];       // the relaxed build's: 32 x scale x the activations' sums, subtracted at the end
        for (int j = 0; j < nt; j++) { isum[j] = wasm_i32x4_splat(0); offs[j] = 0; }
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l += 16) {       // two groups of 16: scale index l / 16
                v128_t a = wasm_v128_load(ql + l), c = wasm_v128_load(ql + 32 + l), h = wasm_v128_load(qh + l);
                v128_t v[4] = {             // the 6-bit levels 0..63, standing for level - 32
                    wasm_v128_or(wasm_v128_and(a, low4), wasm_i8x16_shl(wasm_v128_and(h, three), 4)),
                    wasm_v128_or(wasm_v128_and(c, low4), wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(h, 2), three), 4)),
                    wasm_v128_or(wasm_u8x16_shr(a, 4), wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(h, 4), three), 4)),
                    wasm_v128_or(wasm_u8x16_shr(c, 4), wasm_i8x16_shl(wasm_u8x16_shr(h, 6), 4)),
                };
#ifdef __wasm_relaxed_simd__
                for (int j = 0; j < nt; j++) {
                    const int8_t *x = q + (size_t)j * k + 256 * b + 128 * half + l;
                    const int16_t *bs = meta[(size_t)j * nb + b].bsums + 8 * half + l / 16;   // sums of x + 32 g's 16
                    v128_t s = wasm_i32x4_splat(0);
                    for (int g = 0; g < 4; g++) {
                        int scale = sc[l / 16 + 2 * g];
                        s = wasm_i32x4_add(s, wasm_i32x4_mul(DOT_U(wasm_v128_load(x + 32 * g), v[g], wasm_i32x4_splat(0)), wasm_i32x4_splat(scale)));
                        offs[j] += 32 * scale * bs[2 * g];
                    }
                    isum[j] = wasm_i32x4_add(isum[j], s);
                }
                continue;
#endif
                // int8 scale x 6-bit value fits int16: the scales folded into the weights
                v128_t lo[4], hi[4];
                for (int g = 0; g < 4; g++) {
                    v128_t kk = wasm_i16x8_splat(sc[l / 16 + 2 * g]);
                    v128_t sv = wasm_i8x16_sub(v[g], m32);
                    lo[g] = wasm_i16x8_mul(wasm_i16x8_extend_low_i8x16(sv), kk);
                    hi[g] = wasm_i16x8_mul(wasm_i16x8_extend_high_i8x16(sv), kk);
                }
                for (int j = 0; j < nt; j++) {
                    const int8_t *x = q + (size_t)j * k + 256 * b + 128 * half + l;
                    v128_t s = wasm_i32x4_splat(0);
                    for (int g = 0; g < 4; g++) {
                        v128_t xv = wasm_v128_load(x + 32 * g);
                        s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(lo[g], wasm_i16x8_extend_low_i8x16(xv)));
                        s = wasm_i32x4_add(s, wasm_i32x4_dot_i16x8(hi[g], wasm_i16x8_extend_high_i8x16(xv)));
                    }
                    isum[j] = wasm_i32x4_add(isum[j], s);
                }
            }
        }
        for (int j = 0; j < nt; j++) total[j] += d * meta[(size_t)j * nb + b].d * (float)(hsum_i32x4(isum[j]) - offs[j]);
    }
    for (int j = 0; j < nt; j++) out[j] = total[j];
}

static float dot_f16(const uint8_t *w, const float *x, int k) {
    float s = 0.0f;
    for (int i = 0; i < k; i++) s += f16_to_f32(load_u16(w + 2 * i)) * x[i];
    return s;
}

// Scratch bytes `matmul` needs to round n rows of k activations against a weight of type t.
#define MAX_THREADS 8        // threads a program may run on (scratch is sized for them)
#define F32_ROUTE 0x100      // or-ed into a matmul's type: f32 activations against dequantized rows
#define PER_TOKEN 0x200      // or-ed into a matmul's type: a batched decode step, each token as if alone

// Scratch bytes one thread of `matmul` needs: a dequantized row (the f32 route), or the n rows of k
// activations rounded against a weight of type t. Each thread rounds them itself, into its own part:
// a cheap repetition (n x k against the n x k x m/threads of the products) that saves a barrier.
static uint32_t thread_scratch(int t, int n, int k) {
    uint32_t bytes;
    int type = t & 0xff;
    if (t & F32_ROUTE) bytes = (uint32_t)(k * 4);
    else if (type == T_F32) bytes = 0;
    else if (type == T_F16) bytes = (uint32_t)(n * k * 4);
    else if (type >= T_Q4_K) bytes = (uint32_t)(n * k + n * (k / 256) * sizeof(Q8KMeta));
    else bytes = (uint32_t)(n * k + n * (k / 32) * sizeof(Q8Meta));
    return (bytes + 63) & ~63u;
}

EXPORT(matmul_scratch) uint32_t matmul_scratch(int t, int n, int k) { return thread_scratch(t, n, k) * MAX_THREADS; }

// y[n, m] = x[n, k] . W[m, k]^T (+ bias[m]) (+ residual[n, m]), W in GGUF blocks of type t (the int8
// route), or with F32_ROUTE in t each row dequantized and multiplied in f32. Thread tid of nth takes its
// share of the rows.
static void matmul_part(const float *x, int n, int k, const uint8_t *w, int t, int m, float *y,
                        const float *bias, const float *residual, uint8_t *scratch, int tid, int nth) {
    uint32_t rb = row_bytes(t & 0xff, k);
    int r0 = share_lo(m, tid, nth), r1 = share_lo(m, tid + 1, nth);
    scratch += (size_t)tid * thread_scratch(t, n, k);
    if ((t & F32_ROUTE) && (t & 0xff) != T_F32) {
        float *row = (float *)scratch;
        for (int r = r0; r < r1; r++) {
            dequant_row(t & 0xff, w + (size_t)r * rb, row, k);
            for (int i = 0; i < n; i++) {
                float v = dot_f32(row, x + i * k, k);
                if (bias) v += bias[r];
                if (residual) v += residual[(size_t)i * m + r];
                y[(size_t)i * m + r] = v;
            }
        }
        return;
    }
    int per_token = (t & PER_TOKEN) != 0;
    t &= 0xff;
    int8_t *q = (int8_t *)scratch;
    void *meta = scratch + n * k;
    float *xh = (float *)scratch;
    for (int i = 0; i < n; i++) {            // the activations rounded once, for all of this thread's rows
        if (t == T_F16) for (int j = 0; j < k; j++) xh[i * k + j] = round_f16(x[i * k + j]);
        else if (t >= T_Q4_K) quantize_q8_k(x + i * k, k, q + i * k, (Q8KMeta *)meta + i * (k / 256));
        else if (t != T_F32) quantize_q8_0(x + i * k, k, q + i * k, (Q8Meta *)meta + i * (k / 32));
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * rb;
        for (int i = 0; i < n; i += TOKENS) {
            int nt = n - i < TOKENS ? n - i : TOKENS;
            float v[TOKENS];
            switch (t) {
            case T_F32: for (int j = 0; j < nt; j++) v[j] = dot_f32((const float *)row, x + (size_t)(i + j) * k, k); break;
            case T_F16: for (int j = 0; j < nt; j++) v[j] = dot_f16(row, xh + (size_t)(i + j) * k, k); break;
// each type's kernel called with its type a constant (so inlined for that type alone)
#define FAMILY(T) dot_q8_0_family(T, row, q + (size_t)i * k, (Q8Meta *)meta + (size_t)i * (k / 32), k, nt, per_token, v)
#define K_QUANT(T) dot_q45_k(T, row, q + (size_t)i * k, (Q8KMeta *)meta + (size_t)i * (k / 256), k, nt, v)
            case T_Q4_K: K_QUANT(T_Q4_K); break;
            case T_Q5_K: K_QUANT(T_Q5_K); break;
            case T_Q6_K: dot_q6_k(row, q + (size_t)i * k, (Q8KMeta *)meta + (size_t)i * (k / 256), k, nt, v); break;
            case T_Q4_0: FAMILY(T_Q4_0); break;
            case T_Q4_1: FAMILY(T_Q4_1); break;
            case T_Q5_0: FAMILY(T_Q5_0); break;
            default: FAMILY(T_Q8_0);
#undef FAMILY
#undef K_QUANT
            }
            for (int j = 0; j < nt; j++) {
                float out = v[j];
                if (bias) out += bias[r];
                if (residual) out += residual[(size_t)(i + j) * m + r];
                y[(size_t)(i + j) * m + r] = out;
            }
        }
    }
}

EXPORT(matmul) void matmul(const float *x, int n, int k, const uint8_t *w, int t, int m, float *y,
                           const float *bias, const float *residual, uint8_t *scratch) {
    matmul_part(x, n, k, w, t, m, y, bias, residual, scratch, 0, 1);
}

// ------------------------------------------------------------------ the other ops

// rows of table [vocab, d] (type t) picked by tokens[n] -> y[n, d]
EXPORT(embed) void embed(const uint8_t *table, int t, int d, const int32_t *tokens, int n, float *y) {
    for (int i = 0; i < n; i++) dequant_row(t, table + (size_t)tokens[i] * row_bytes(t, d), y + (size_t)i * d, d);
}

// y = x / rms(x) * w per row of d (+ residual); the mean square summed in double, as the reference does
EXPORT(rmsnorm) void rmsnorm(const float *x, int rows, int d, const float *w, float eps, float *y, const float *residual) {
    for (int r = 0; r < rows; r++, x += d, y += d) {
        double ss = 0.0;
        for (int j = 0; j < d; j++) ss += (double)x[j] * x[j];
        float inv = (float)(1.0 / sqrt(ss / d + eps));
        for (int j = 0; j < d; j++) {
            float v = x[j] * inv * w[j];
            y[j] = residual ? residual[(size_t)r * d + j] + v : v;
        }
    }
}

// Rope of x [n, heads, hd] into y (which may be x): pair i of the first `dims` turns by pos * per_pair[i] (f64, YaRN and
// frequency factors folded in, pyshim.models.rope.pair_tables), cos and sin scaled by mscale. `scale` (or NULL):
// [heads, hd], each rotated head then multiplied by it element by element (a q4/q8 cache's key scales,
// pyshim.models.key_scales).
EXPORT(rope) void rope(const float *x, float *y, int n, int heads, int hd, const int32_t *pos, const double *per_pair, int dims,
                       int neox, float mscale, const float *scale) {
    if (y != x)                               // the dims past `dims` pass through
        for (size_t i = 0; i < (size_t)n * heads; i++) memcpy(y + i * hd + dims, x + i * hd + dims, (size_t)(hd - dims) * 4);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < dims / 2; i++) {
            double angle = (double)pos[t] * per_pair[i];
            float c = (float)(cos(angle) * mscale), s = (float)(sin(angle) * mscale);
            for (int h = 0; h < heads; h++) {
                const float *v = x + ((size_t)t * heads + h) * hd;
                float *out = y + ((size_t)t * heads + h) * hd;
                int a = neox ? i : 2 * i, b = neox ? i + dims / 2 : 2 * i + 1;
                float x1 = v[a], x2 = v[b];
                out[a] = x1 * c - x2 * s;
                out[b] = x2 * c + x1 * s;
            }
        }
    }
    if (scale)
        for (size_t i = 0; i < (size_t)n * heads * hd; i++) y[i] *= scale[i % ((size_t)heads * hd)];
}

// Hadamard rotation of x [count] into y (which may be x): each group of `width` values multiplied by the orthonormal
// Sylvester matrix (a q4 cache's keys and queries, pyshim.models.key_scales.hadamard): butterfly stages (a + b, a - b)
// over pairs `span` apart, span = 1, 2, 4, ..., then times `norm` (f32(1 / sqrt(width))) — the reference's order.
EXPORT(hadamard) void hadamard(const float *x, float *y, int count, int width, float norm) {
    if (y != x) memcpy(y, x, (size_t)count * 4);
    for (size_t g = 0; g < (size_t)count; g += width) {
        float *v = y + g;
        for (int span = 1; span < width; span *= 2)
            for (int i = 0; i < width / 2; i++) {
                int j = i / span * 2 * span + i % span;
                float a = v[j], b = v[j + span];
                v[j] = a + b;
                v[j + span] = a - b;
            }
        for (int i = 0; i < width; i++) v[i] *= norm;
    }
}

// The KV cache's types (pyshim.plan.settings.KV_TYPES; pyshim.exec.kvcache rounds as these store): a row
// of `count` values (one head of one position) is f32, f16, or blocks of 32 — q8: an f32 scale amax / 127
// and 32 int8 (36 bytes); q4: an f32 scale d = m / -8 (m: the first value of largest magnitude) and 16
// bytes of 4-bit q = floor(x / d + 8.5) clamped to [0, 15], value (q - 8) * d, value j of the block in
// byte j % 16, low nibble for j < 16 (20 bytes).
enum { KV_F32 = 0, KV_F16, KV_Q8, KV_Q4 };

static size_t kv_row_bytes(int type, int count) {
    switch (type) {
    case KV_F16: return (size_t)count * 2;
    case KV_Q8: return (size_t)count / 32 * 36;
    case KV_Q4: return (size_t)count / 32 * 20;
    default: return (size_t)count * 4;
    }
}

static void kv_store_row(int type, const float *x, int count, uint8_t *row) {
    if (type == KV_F32) { memcpy(row, x, (size_t)count * 4); return; }
    if (type == KV_F16) { for (int i = 0; i < count; i++) { uint16_t h = f32_to_f16(x[i]); memcpy(row + 2 * i, &h, 2); } return; }
    for (int b = 0; b < count / 32; b++, x += 32) {
        if (type == KV_Q8) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            memcpy(row, &d, 4);
            for (int j = 0; j < 32; j++) row[4 + j] = (uint8_t)(int8_t)fminf(fmaxf(rintf(x[j] * inv), -127.0f), 127.0f);
            row += 36;
        } else {
            float m = 0.0f, amax = 0.0f;
            for (int j = 0; j < 32; j++) if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); m = x[j]; }
            float d = m / -8.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(row, &d, 4);
            uint8_t q[32];
            for (int j = 0; j < 32; j++) q[j] = (uint8_t)fminf(fmaxf(floorf(x[j] * inv + 8.5f), 0.0f), 15.0f);
            for (int j = 0; j < 16; j++) row[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
            row += 20;
        }
    }
}

// A stored row back as f32 (`out`); an f32 row is returned as it lies, without a copy.
static const float *kv_load_row(int type, const uint8_t *row, int count, float *out) {
    if (type == KV_F32) return (const float *)row;
    if (type == KV_F16) { for (int i = 0; i < count; i++) out[i] = f16_to_f32(load_u16(row + 2 * i)); return out; }
    float *y = out;
    for (int b = 0; b < count / 32; b++, y += 32) {
        float d;
        memcpy(&d, row, 4);
        if (type == KV_Q8) {
            for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)row[4 + j] * d;
            row += 36;
        } else {
            for (int j = 0; j < 16; j++) {
                y[j] = (float)((row[4 + j] & 15) - 8) * d;
                y[j + 16] = (float)((row[4 + j] >> 4) - 8) * d;
            }
            row += 20;
        }
    }
    return out;
}

#define MAX_HEAD_DIM 512

// This step's k [n, hkv, hd] and v [n, hkv, hdv] stored in the layer's cache at their positions (as
// `kv_type`), then each query attends over positions <= its own (and within `window` when > 0): scores
// scaled, soft-capped when softcap > 0, softmax, values summed. q [n, hq, hd] -> y [n, hq * hdv]. Caches:
// [n_ctx, hkv] rows of hd (hdv) values of the type. scratch: a row of n_ctx scores per thread. Thread tid of
// nth takes its share of (token, head) pairs once thread 0 has stored the keys.
static void attention_part(const float *q, const float *k, const float *v, const int32_t *pos, int n, int hq,
                           int hkv, int hd, int hdv, uint8_t *kc, uint8_t *vc, float scale, int window, float softcap,
                           float *y, float *scores, int n_ctx, int kv_type, int tid, int nth) {
    size_t krow = kv_row_bytes(kv_type, hd), vrow = kv_row_bytes(kv_type, hdv);
    if (tid == 0) {
        for (int t = 0; t < n; t++)
            for (int g = 0; g < hkv; g++) {
                kv_store_row(kv_type, k + ((size_t)t * hkv + g) * hd, hd, kc + ((size_t)pos[t] * hkv + g) * krow);
                kv_store_row(kv_type, v + ((size_t)t * hkv + g) * hdv, hdv, vc + ((size_t)pos[t] * hkv + g) * vrow);
            }
    }
    barrier(nth);
    scores += (size_t)tid * n_ctx;
    float row[MAX_HEAD_DIM] __attribute__((aligned(16)));
    int group = hq / hkv, p0 = share_lo(n * hq, tid, nth), p1 = share_lo(n * hq, tid + 1, nth);
    for (int pair = p0; pair < p1; pair++) {
        int t = pair / hq, h = pair % hq;
        int last = pos[t], first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
        const float *qh = q + ((size_t)t * hq + h) * hd;
        int g = h / group;
        float best = -INFINITY;
        for (int p = first; p <= last; p++) {
            float s = dot_f32(qh, kv_load_row(kv_type, kc + ((size_t)p * hkv + g) * krow, hd, row), hd) * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            scores[p] = s;
            if (s > best) best = s;
        }
        float total = 0.0f;
        for (int p = first; p <= last; p++) { scores[p] = expf(scores[p] - best); total += scores[p]; }
        float *out = y + ((size_t)t * hq + h) * hdv;
        v128_t inv = wasm_f32x4_splat(1.0f / total);
        for (int j = 0; j + 4 <= hdv; j += 4) wasm_v128_store(out + j, wasm_f32x4_splat(0.0f));
        for (int p = first; p <= last; p++) {
            const float *vr = kv_load_row(kv_type, vc + ((size_t)p * hkv + g) * vrow, hdv, row);
            v128_t w = wasm_f32x4_splat(scores[p]);
            for (int j = 0; j + 4 <= hdv; j += 4)
                wasm_v128_store(out + j, wasm_f32x4_add(wasm_v128_load(out + j), wasm_f32x4_mul(w, wasm_v128_load(vr + j))));
        }
        for (int j = 0; j + 4 <= hdv; j += 4) wasm_v128_store(out + j, wasm_f32x4_mul(wasm_v128_load(out + j), inv));
    }
}

EXPORT(attention) void attention(const float *q, const float *k, const float *v, const int32_t *pos, int n, int hq,
                                 int hkv, int hd, int hdv, uint8_t *kc, uint8_t *vc, float scale, int window, float softcap,
                                 float *y, float *scores, int n_ctx, int kv_type) {
    attention_part(q, k, v, pos, n, hq, hkv, hd, hdv, kc, vc, scale, window, softcap, y, scores, n_ctx, kv_type, 0, 1);
}

#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535588f
#define GELU_TABLE_LIMIT 10.0f

static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

// act(gate) * up over `count` values. act 0: SiLU; 1: tanh-GELU; 2: tanh-GELU as llama.cpp's CPU backend
// computes it (its input and output rounded to f16, exact outside (-10, 10): the int8 route's)
EXPORT(glu) void glu(const float *gate, const float *up, int count, int act, float *y) {
    for (int i = 0; i < count; i++) {
        float g = gate[i], a;
        if (act == 0) a = g / (1.0f + expf(-g));
        else if (act == 1) a = gelu_tanh(g);
        else a = g <= -GELU_TABLE_LIMIT ? 0.0f : g >= GELU_TABLE_LIMIT ? g : round_f16(gelu_tanh(round_f16(g)));
        y[i] = a * up[i];
    }
}

// y = a + b; y = x * s; y = cap * tanh(x / cap); cols `cols` of each of `rows` rows of `stride` copied
EXPORT(add) void add(const float *a, const float *b, int count, float *y) { for (int i = 0; i < count; i++) y[i] = a[i] + b[i]; }
EXPORT(scale) void scale(const float *x, int count, float s, float *y) { for (int i = 0; i < count; i++) y[i] = x[i] * s; }
EXPORT(softcap) void softcap(const float *x, int count, float cap, float *y) {
    for (int i = 0; i < count; i++) y[i] = tanhf(x[i] / cap) * cap;
}
EXPORT(copy_cols) void copy_cols(const float *x, int rows, int stride, int cols, float *y) {
    for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * cols, x + (size_t)r * stride, (size_t)cols * 4);
}

// each row's largest value's index (the first of equals) -> out[rows]
EXPORT(argmax) void argmax(const float *x, int rows, int cols, int32_t *out) {
    for (int r = 0; r < rows; r++, x += cols) {
        int best = 0;
        for (int j = 1; j < cols; j++) if (x[j] > x[best]) best = j;
        out[r] = best;
    }
}

// Each row's k largest values, largest first (equal values: the lower index first, as a stable sort
// orders them) -> ids[rows, k], vals[rows, k]: a sampled step's candidates, so that only they cross to
// Python, not the vocabulary's logits. k <= cols.
EXPORT(topk) void topk(const float *x, int rows, int cols, int k, int32_t *ids, float *vals) {
    for (int r = 0; r < rows; r++, x += cols, ids += k, vals += k) {
        int have = 0;
        for (int j = 0; j < cols; j++) {
            float v = x[j];
            if (have == k && !(v > vals[k - 1])) continue;      // (most values stop here)
            int at = have < k ? have++ : k - 1;
            for (; at > 0 && v > vals[at - 1]; at--) { vals[at] = vals[at - 1]; ids[at] = ids[at - 1]; }
            vals[at] = v;
            ids[at] = j;
        }
    }
}

// ------------------------------------------------------------------ mixtures of experts

#define MAX_EXPERTS 256
#define ROUTER_NORM_MIN 6.103515625e-5f     // the sum of the chosen weights is clamped here (llama.cpp: f16's smallest normal)

// The router (pyshim.exec.reference's route): each row of logits [n, e] gated (0: softmax, 1: sigmoid),
// its `used` largest probabilities picked in descending order (ties: the lower expert), divided by their
// sum when `norm`, times `scale`, then (`scales` not NULL: gemma4's per-expert output scales) times its
// expert's entry of `scales`: weights [n, used] f32, ids [n, used] int32.
EXPORT(route) void route(const float *logits, int n, int e, int used, int gating, int norm, float scale, float *weights,
                         int32_t *ids, const float *scales) {
    float probs[MAX_EXPERTS];
    for (int t = 0; t < n; t++) {
        const float *x = logits + (size_t)t * e;
        if (gating == 0) {
            float best = x[0], total = 0.0f;
            for (int j = 1; j < e; j++) best = x[j] > best ? x[j] : best;
            for (int j = 0; j < e; j++) { probs[j] = expf(x[j] - best); total += probs[j]; }
            for (int j = 0; j < e; j++) probs[j] /= total;
        } else {
            for (int j = 0; j < e; j++) probs[j] = 1.0f / (1.0f + expf(-x[j]));
        }
        uint8_t taken[MAX_EXPERTS] = {0};
        float *w = weights + (size_t)t * used, sum = 0.0f;
        int32_t *id = ids + (size_t)t * used;
        for (int u = 0; u < used; u++) {
            int best = -1;
            for (int j = 0; j < e; j++) if (!taken[j] && (best < 0 || probs[j] > probs[best])) best = j;
            taken[best] = 1;
            id[u] = best;
            w[u] = probs[best];
            sum += probs[best];
        }
        if (norm) for (int u = 0; u < used; u++) w[u] /= sum > ROUTER_NORM_MIN ? sum : ROUTER_NORM_MIN;
        if (scale != 1.0f) for (int u = 0; u < used; u++) w[u] *= scale;
        if (scales) for (int u = 0; u < used; u++) w[u] *= scales[id[u]];
    }
}

// Each (token, slot) pair times its expert's matrix: y[p] = x[p / per] . W[ids[p]]^T, W [e][m][k] in
// blocks of type t (a matmul's type word), x a row per token (per = used) or per pair (per = 1). Each
// pair is a one-row matmul, thread tid taking its share of the expert's rows.
static void expert_matmul_part(const float *x, int pairs, int per, int k, const uint8_t *w, int t, int m,
                               const int32_t *ids, float *y, uint8_t *scratch, int tid, int nth) {
    size_t expert_bytes = (size_t)m * row_bytes(t & 0xff, k);
    for (int p = 0; p < pairs; p++)
        matmul_part(x + (size_t)(p / per) * k, 1, k, w + (size_t)ids[p] * expert_bytes, t, m, y + (size_t)p * m,
                    0, 0, scratch, tid, nth);
}

// Each token's experts' outputs y [n * used, d] weighted and summed in slot order: out [n, d].
EXPORT(expert_sum) void expert_sum(const float *y, const float *weights, int n, int used, int d, float *out) {
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * d;
        for (int u = 0; u < used; u++) {
            const float *r = y + ((size_t)t * used + u) * d;
            float w = weights[(size_t)t * used + u];
            for (int i = 0; i < d; i++) o[i] = u ? o[i] + r[i] * w : r[i] * w;
        }
    }
}

// x [n, d] times the sigmoid of its row's gate g [n] (Qwen2-MoE's shared expert).
EXPORT(sigmoid_gate) void sigmoid_gate(const float *x, const float *g, int n, int d, float *out) {
    for (int t = 0; t < n; t++) {
        float s = 1.0f / (1.0f + expf(-g[t]));
        for (int i = 0; i < d; i++) out[(size_t)t * d + i] = x[(size_t)t * d + i] * s;
    }
}

// ------------------------------------------------------------------ programs

enum {
    OP_EMBED = 1, OP_MATMUL, OP_RMSNORM, OP_ROPE, OP_ATTENTION, OP_GLU, OP_ADD, OP_SCALE, OP_SOFTCAP,
    OP_COPY_COLS, OP_ARGMAX, OP_TOPK, OP_ROUTE, OP_EXPERT_MATMUL, OP_EXPERT_SUM, OP_SIGMOID_GATE, OP_HADAMARD,
};
#define OP_LAST OP_HADAMARD
#define OP_WORDS 20

// A word holds a pointer, an int or a float's bits (in its first four bytes): 4 bytes in the wasm32
// build, 8 in the wasm64 one (Python asks `word_bytes`).
#ifdef __wasm64__
typedef union { int64_t i; float f; } Word;
#define P(j) ((void *)(uintptr_t)a[j].i)
#define I(j) ((int)a[j].i)
#else
typedef union { int32_t i; float f; } Word;
#define P(j) ((void *)(uintptr_t)(uint32_t)a[j].i)
#define I(j) (a[j].i)
#endif
#define F(j) (a[j].f)

// Thread tid's part of `count` ops of OP_WORDS words each from `prog`; the index of an unknown op + 1, else 0.
static inline int is_parallel(int op) { return op == OP_MATMUL || op == OP_ATTENTION || op == OP_EXPERT_MATMUL; }

static int run_ops(const Word *prog, int count, int tid, int nth) {
    for (int at = 0; at < count; at++, prog += OP_WORDS) {
        const Word *a = prog + 1;
        int op = (int)prog[0].i;
        if (op == OP_MATMUL) {
            matmul_part(P(0), I(1), I(2), P(3), I(4), I(5), P(6), P(7), P(8), P(9), tid, nth);
        } else if (op == OP_EXPERT_MATMUL) {
            expert_matmul_part(P(0), I(1), I(2), I(3), P(4), I(5), I(6), P(7), P(8), P(9), tid, nth);
        } else if (op == OP_ATTENTION) {
            attention_part(P(0), P(1), P(2), P(3), I(4), I(5), I(6), I(7), I(8), P(9), P(10), F(11), I(12), F(13), P(14),
                           P(15), I(16), I(17), tid, nth);
        } else if (tid == 0) {
            switch (op) {
            case OP_EMBED: embed(P(0), I(1), I(2), P(3), I(4), P(5)); break;
            case OP_RMSNORM: rmsnorm(P(0), I(1), I(2), P(3), F(4), P(5), P(6)); break;
            case OP_ROPE: rope(P(0), P(1), I(2), I(3), I(4), P(5), P(6), I(7), I(8), F(9), P(10)); break;
            case OP_GLU: glu(P(0), P(1), I(2), I(3), P(4)); break;
            case OP_ADD: add(P(0), P(1), I(2), P(3)); break;
            case OP_SCALE: scale(P(0), I(1), F(2), P(3)); break;
            case OP_SOFTCAP: softcap(P(0), I(1), F(2), P(3)); break;
            case OP_COPY_COLS: copy_cols(P(0), I(1), I(2), I(3), P(4)); break;
            case OP_ARGMAX: argmax(P(0), I(1), I(2), P(3)); break;
            case OP_TOPK: topk(P(0), I(1), I(2), I(3), P(4), P(5)); break;
            case OP_ROUTE: route(P(0), I(1), I(2), I(3), I(4), I(5), F(6), P(7), P(8), P(9)); break;
            case OP_EXPERT_SUM: expert_sum(P(0), P(1), I(2), I(3), I(4), P(5)); break;
            case OP_SIGMOID_GATE: sigmoid_gate(P(0), P(1), I(2), I(3), P(4)); break;
            case OP_HADAMARD: hadamard(P(0), P(1), I(2), I(3), F(4)); break;
            default: return at + 1;
            }
        } else if (op < OP_EMBED || op > OP_LAST) {
            return at + 1;                  // (as thread 0 does, before the barrier it would wait in)
        }
        // every thread sees the op's results before the next op starts; between two of thread 0's own
        // ops nobody else runs, so it needs none (the decision is the program's: the same on every thread)
        if (is_parallel(op) || at + 1 == count || is_parallel((int)prog[OP_WORDS].i)) barrier(nth);
    }
    return 0;
}

// The words an op takes, their size, and the revision of what ops mean (2: a matmul's PER_TOKEN flag;
// 3: the mixture of experts' ops; 5: hadamard; 6: the wasm64 build, alloc's pointer-sized argument; 7: the
// router's per-expert scales): Python checks them against its own (a module built from an older engine.c says so).
EXPORT(op_words) int op_words(void) { return OP_WORDS; }
EXPORT(word_bytes) int word_bytes(void) { return (int)sizeof(Word); }
EXPORT(abi) int abi(void) { return 7; }

// Run a program on this thread alone.
EXPORT(run) int run(const Word *prog, int count) { return run_ops(prog, count, 0, 1); }

#ifdef __wasm_atomics__
// The threaded build: thread 0 (the caller) starts the helpers, which sleep in `worker`, and runs its part.
static volatile int32_t go_gen = 0, go_count = 0, go_threads = 1, go_quit = 0;
static const Word *volatile go_prog = 0;

EXPORT(run_mt) int run_mt(const Word *prog, int count, int nth) {
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    go_prog = prog;
    go_count = count;
    go_threads = nth;
    __atomic_fetch_add(&go_gen, 1, __ATOMIC_RELEASE);
    __builtin_wasm_memory_atomic_notify((int *)&go_gen, 0xffffffffu);
    return run_ops(prog, count, 0, nth);
}

// The helpers leave their loop (natively, where a thread cannot be terminated from outside).
EXPORT(stop_workers) void stop_workers(void) {
    go_quit = 1;
    __atomic_fetch_add(&go_gen, 1, __ATOMIC_RELEASE);
    __builtin_wasm_memory_atomic_notify((int *)&go_gen, 0xffffffffu);
}

// A helper thread's life (a Web Worker calls it once): each run's part, then sleep, until stop_workers.
// Its first generation is 0, not go_gen's value when it gets here: the helpers are made before the first
// run, but one that starts late (a slow instantiation on a busy machine) would otherwise skip the run
// already waiting for it at its first barrier, and both sides would wait for ever.
EXPORT(worker) void worker(int tid) {
    int32_t seen = 0;
    for (;;) {
        for (int spin = 0; spin < SPINS && __atomic_load_n(&go_gen, __ATOMIC_ACQUIRE) == seen; spin++) {}
        while (__atomic_load_n(&go_gen, __ATOMIC_ACQUIRE) == seen)
            __builtin_wasm_memory_atomic_wait32((int *)&go_gen, seen, -1);
        seen = __atomic_load_n(&go_gen, __ATOMIC_ACQUIRE);
        if (go_quit) return;
        const Word *prog = go_prog;
        int count = go_count, nth = go_threads;
        if (tid < nth) run_ops(prog, count, tid, nth);
    }
}
#endif
