// Radix-2 NTT over Fr as shared-memory passes of decimation-in-frequency stages
// (four-step decomposition), plus the bit-reversal pass.
//
// A transform of n = 2^log_n points runs as P passes of k_1 + ... + k_P = log_n
// stages. Before pass p, `done` = k_1 + ... + k_{p-1} bits are done and the data are
// 2^done independent sub-problems of M = 2^(log_n - done) contiguous points. Pass p
// writes u = hi·2^c + lo (hi < 2^k, lo < 2^c, c = log_n - done - k) of each
// sub-problem as a 2^k-point DFT over hi for every column lo (a k-stage DIF with
// roots of order 2^k, in shared memory), leaving frequency k1 at row brev_k(k1),
// then multiplies it by the four-step twiddle w_M^(lo·k1). The last pass has c = 0
// and no twiddle. The result is the DFT in bit-reversed order; `ntt_bitrev_scale`
// permutes it to natural order and applies the per-index scale of the variant.
//
// Roots come from tables uploaded once per GPU (src/device/cuda/ntt.rs):
//   small[j]  = w_{2^MAX_PASS_LOG}^j,   j < 2^(MAX_PASS_LOG-1)
//   hi[a]·lo[b] = w_{2^MAX_LOG_N}^(a·2^TW_SPLIT + b)
// where w_{2^s} = arkworks' `Fr::get_root_of_unity(2^s)` (or its inverse for the
// inverse transform). The coset tables hold g^i (or g^-i), g = 7, in the same split.
#pragma once

#include "bls12_381.cuh"

namespace ntt {
// Must match src/device/cuda/ntt.rs.
constexpr uint32_t MAX_LOG_N = 28;
constexpr uint32_t TW_SPLIT = 14;
constexpr uint32_t MAX_PASS_LOG = 11;

// hi[t >> TW_SPLIT] · lo[t mod 2^TW_SPLIT]: the t-th power of the tables' root.
__device__ __forceinline__ fr_t table_pow(const fr_t* __restrict__ hi, const fr_t* __restrict__ lo,
                                          uint32_t t) {
    return hi[t >> TW_SPLIT] * lo[t & ((1u << TW_SPLIT) - 1)];
}

__device__ __forceinline__ uint32_t brev(uint32_t x, uint32_t bits) {
    return bits == 0 ? 0 : __brev(x) >> (32 - bits);
}

// Writes a pass output at `row` of the block's tile, with the four-step twiddle.
__device__ __forceinline__ void dif_store(fr_t* __restrict__ data, size_t base, uint32_t row,
                                          uint32_t col, uint32_t lo, uint32_t c, uint32_t k,
                                          uint32_t log_m, fr_t v, const fr_t* __restrict__ tw_hi,
                                          const fr_t* __restrict__ tw_lo) {
    if (c > 0) {
        uint32_t k1 = brev(row, k);
        uint32_t e = lo * k1;  // < 2^(c+k) = M
        v = v * table_pow(tw_hi, tw_lo, e << (MAX_LOG_N - log_m));
    }
    data[base + ((size_t)row << c) + col] = v;
}

// One pass of k DIF stages. Block tile: 2^k rows × T = 2^log_t consecutive columns;
// gridDim.x = n / (2^k·T); dynamic shared memory 2^k·T fr_t.
__device__ __forceinline__ void dif_pass(fr_t* __restrict__ data, uint32_t log_n, uint32_t done,
                                         uint32_t k, uint32_t log_t, const fr_t* __restrict__ small,
                                         const fr_t* __restrict__ tw_hi,
                                         const fr_t* __restrict__ tw_lo,
                                         const fr_t* __restrict__ coset_hi,
                                         const fr_t* __restrict__ coset_lo) {
    extern __shared__ fr_t smem[];
    const uint32_t log_m = log_n - done;
    const uint32_t c = log_m - k;
    const uint32_t T = 1u << log_t;
    const uint32_t log_groups = c - log_t;  // column groups per sub-problem
    const size_t sub = blockIdx.x >> log_groups;
    const uint32_t cg = blockIdx.x & ((1u << log_groups) - 1);
    const size_t base = (sub << log_m) + ((size_t)cg << log_t);
    const uint32_t half_rows = 1u << (k - 1);
    const uint32_t butterflies = half_rows << log_t;
    const uint32_t small_shift = MAX_PASS_LOG - k;

    // Stage 0: rows r and r + 2^(k-1), straight from global memory.
    for (uint32_t b = threadIdx.x; b < butterflies; b += blockDim.x) {
        const uint32_t col = b & (T - 1), r = b >> log_t;
        const size_t i0 = base + ((size_t)r << c) + col;
        const size_t i1 = i0 + ((size_t)half_rows << c);
        fr_t x0 = data[i0], x1 = data[i1];
        if (coset_hi != nullptr) {  // coset NTT: coefficient i times g^i (first pass only)
            x0 = x0 * table_pow(coset_hi, coset_lo, (uint32_t)i0);
            x1 = x1 * table_pow(coset_hi, coset_lo, (uint32_t)i1);
        }
        const fr_t s = x0 + x1;
        fr_t d = x0 - x1;
        if (k == 1) {  // the only butterfly's twiddle is w^0 = 1
            const uint32_t lo = (cg << log_t) + col;
            dif_store(data, base, 0, col, lo, c, k, log_m, s, tw_hi, tw_lo);
            dif_store(data, base, 1, col, lo, c, k, log_m, d, tw_hi, tw_lo);
        } else {
            d = d * small[r << small_shift];
            smem[(r << log_t) + col] = s;
            smem[((r + half_rows) << log_t) + col] = d;
        }
    }
    // Stages 1..k-1 in shared memory; the last one writes to global memory.
    for (uint32_t t = 1; t < k; t++) {
        __syncthreads();
        const uint32_t log_hl = k - 1 - t;
        const uint32_t hl = 1u << log_hl;
        for (uint32_t b = threadIdx.x; b < butterflies; b += blockDim.x) {
            const uint32_t col = b & (T - 1), r = b >> log_t;
            const uint32_t j = r & (hl - 1);
            const uint32_t x = ((r >> log_hl) << (log_hl + 1)) + j;
            const fr_t a0 = smem[(x << log_t) + col];
            const fr_t a1 = smem[((x + hl) << log_t) + col];
            const fr_t s = a0 + a1;
            fr_t d = a0 - a1;
            if (t == k - 1) {  // half-length 1: j = 0, twiddle w^0 = 1 (no multiplication)
                const uint32_t lo = (cg << log_t) + col;
                dif_store(data, base, x, col, lo, c, k, log_m, s, tw_hi, tw_lo);
                dif_store(data, base, x + hl, col, lo, c, k, log_m, d, tw_hi, tw_lo);
            } else {
                d = d * small[j << (small_shift + t)];
                smem[(x << log_t) + col] = s;
                smem[((x + hl) << log_t) + col] = d;
            }
        }
    }
}

// In-place bit-reversal permutation with a per-index factor on the output:
// out[i] = in[brev(i)] · scale_i, scale_i = (scale if has_scale) · (hi·lo table power
// i if hi != null). One thread per index; the thread with i < brev(i) swaps the pair.
__device__ __forceinline__ void bitrev_scale(fr_t* __restrict__ data, uint32_t log_n,
                                             bool has_scale, const fr_t& scale,
                                             const fr_t* __restrict__ hi,
                                             const fr_t* __restrict__ lo) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (log_n > 31 || i >= (1u << log_n)) return;
    const uint32_t j = brev(i, log_n);
    if (i > j) return;
    const bool scaled = has_scale || hi != nullptr;
    auto factor = [&](uint32_t idx) {
        fr_t f = has_scale ? scale : fr_t::one();
        if (hi != nullptr) f = has_scale ? f * table_pow(hi, lo, idx) : table_pow(hi, lo, idx);
        return f;
    };
    const fr_t xi = data[i];
    if (i == j) {
        if (scaled) data[i] = xi * factor(i);
        return;
    }
    const fr_t xj = data[j];
    data[i] = scaled ? xj * factor(i) : xj;
    data[j] = scaled ? xi * factor(j) : xi;
}
}  // namespace ntt
