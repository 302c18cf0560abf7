// The int8 block decoder of the weight type named by a W_* define (exactly one), for matvec_i8.wgsl.
// Each defines BLOCK_ELEMS, BLOCK_BYTES and block_dot(byte offset of the block, block index in the row)
// -> f32, reading the quantized activations through the family's xv(j) (vec4 j of int8 words) and xm(j)
// (vec4 j of block metadata). Integer sums are exact; floats are applied per block as llama.cpp does.
#include "include/bytes.wgsl"
#include "include/unpack_i8.wgsl"
#ifdef W_Q4_1
#include "include/q4_1_i8.wgsl"
#endif
#ifdef W_Q5_0
#include "include/q5_0_i8.wgsl"
#endif
#ifdef W_Q8_0G
#include "include/q8_0g_i8.wgsl"
#endif
#ifdef W_Q4_K
#include "include/q4_k_i8.wgsl"
#endif
#ifdef W_Q5_K
#include "include/q5_k_i8.wgsl"
#endif
#ifdef W_Q6_KG
#include "include/q6_kg_i8.wgsl"
#endif
#ifdef W_Q4_0G
#include "include/q4_0g_i8.wgsl"
#endif
