// Radix-2 NTT over Fr as shared-memory passes of decimation-in-frequency stages
// (four-step decomposition), plus the bit-reversal pass.
//
// A transform of n = 2^log_n points runs as P passes of k_1 + ... + k_P = log_n
// stages. Before pass p, `done` = k_1 + ... + k_{p-1} bits are done and the data are
// 2^done independent sub-problems of M = 2^(log_n - done) contiguous points. Pass p
// writes u = hi·2^c + lo (hi < 2^k, lo < 2^c, c = log_n - done - k) of each
// sub-problem as a 2^k-point DFT over hi for every column lo (a k-stage DIF with
// roots of order 2^k), leaving frequency k1 at row brev_k(k1), then multiplies it by
// the four-step twiddle w_M^(lo·k1). The last pass has c = 0 and no twiddle. The
// result is the DFT in bit-reversed order; the bit-reversal pass (`bitrev_tiled`, or
// `bitrev_scale` below 2^8 points) permutes it to natural order and applies the
// per-index scale of the variant. With a scratch buffer (dif_pass<BREV = true>) the
// last pass writes each output to its bit-reversed index itself, out of place.
//
// Within a pass, the k stages run in groups of at most MAX_GROUP = 2 (`stage_group`):
// each thread loads the 2^R rows that a group of R stages mixes, runs the R stages in
// registers, and stores them back, so a pass costs ⌈k/2⌉ trips through shared memory
// (the first group reads global memory, the last writes it) instead of one per stage.
//
// Roots come from tables uploaded once per GPU (src/device/cuda/ntt.rs):
//   small[j]  = w_{2^MAX_PASS_LOG}^j,   j < 2^(MAX_PASS_LOG-1)
//   direct[e] = w_{2^DIRECT_LOG}^e,     e < 2^DIRECT_LOG
//   hi[a]·lo[b] = w_{2^MAX_LOG_N}^(a·2^TW_SPLIT + b)
// where w_{2^s} = arkworks' `Fr::get_root_of_unity(2^s)` (or its inverse for the
// inverse transform). A four-step twiddle costs one product where M ≤ 2^DIRECT_LOG
// (one table read) and two above (hi·lo). The coset tables hold g^i (or g^-i), g = 7,
// in the hi/lo split.
#pragma once

#include "bls12_381.cuh"

namespace ntt {
// Must match src/device/cuda/ntt.rs.
constexpr uint32_t MAX_LOG_N = 28;
constexpr uint32_t TW_SPLIT = 14;
constexpr uint32_t MAX_PASS_LOG = 11;
constexpr uint32_t DIRECT_LOG = 16;
// Most stages one thread runs in registers (2^MAX_GROUP rows per thread). Two, not
// three: eight rows in registers took 168 registers (12 warps per SM, latency-bound);
// four take 96, five blocks of four warps per SM, and 2^24 ran 5.56 -> 4.98 ms on the
// H100 for one more trip through shared memory per pass (docs/benchmarks.md).
constexpr int MAX_GROUP = 2;

// hi[t >> TW_SPLIT] · lo[t mod 2^TW_SPLIT]: the t-th power of the tables' root.
__device__ __forceinline__ fr_t table_pow(const fr_t* __restrict__ hi, const fr_t* __restrict__ lo,
                                          uint32_t t) {
    return hi[t >> TW_SPLIT] * lo[t & ((1u << TW_SPLIT) - 1)];
}

__device__ __forceinline__ uint32_t brev(uint32_t x, uint32_t bits) {
    return bits == 0 ? 0 : __brev(x) >> (32 - bits);
}

// Where one block works: a tile of 2^k rows × 2^log_t consecutive columns of one
// sub-problem, row r and column col at index base + (r << c) + col of src (read by
// the pass's first stage group) and dst (written by its last). src == dst in place.
struct Tile {
    const fr_t* src;
    fr_t* dst;
    size_t base;
    uint32_t log_n, log_m, c, k, log_t;
    uint32_t lo0;  // the sub-problem column of the tile's column 0
};

// The per-index output factor of a transform's last step (see bitrev_scale): scale
// (if has_scale) times the hi·lo table power of the output index (if hi != null).
struct OutFactor {
    bool has_scale;
    fr_t scale;
    const fr_t* hi;
    const fr_t* lo;
    __device__ __forceinline__ bool any() const { return has_scale || hi != nullptr; }
};

// The tables one pass reads (null coset pointers: not a coset input pass).
struct Roots {
    const fr_t* small;
    const fr_t* direct;
    const fr_t* tw_hi;
    const fr_t* tw_lo;
    const fr_t* coset_hi;
    const fr_t* coset_lo;
};

// v · w_M^(lo·brev_k(row)): the four-step twiddle of a pass output (M = 2^log_m).
__device__ __forceinline__ fr_t four_step(const Tile& t, const Roots& w, uint32_t row,
                                          uint32_t lo, fr_t v) {
    const uint32_t e = lo * brev(row, t.k);  // < 2^(c+k) = M
    if (t.log_m <= DIRECT_LOG) return v * w.direct[e << (DIRECT_LOG - t.log_m)];
    return v * table_pow(w.tw_hi, w.tw_lo, e << (MAX_LOG_N - t.log_m));
}

// The output factor of index idx written by the bit reversal (see bitrev_scale).
__device__ __forceinline__ fr_t bitrev_factor(uint32_t idx, bool has_scale, const fr_t& scale,
                                              const fr_t* __restrict__ hi,
                                              const fr_t* __restrict__ lo) {
    fr_t f = has_scale ? scale : fr_t::one();
    if (hi != nullptr) f = has_scale ? f * table_pow(hi, lo, idx) : table_pow(hi, lo, idx);
    return f;
}

// Stages first..first+R-1 of the tile's k-stage DIF. Virtual thread v owns column
// col and the rows row0 + (i << d), i < 2^R, d = k - first - R: exactly the rows those
// stages mix, disjoint from every other virtual thread's, so the group needs no
// synchronization inside. FIRST reads global memory (and applies the coset powers),
// LAST (d = 0) writes global memory with the four-step twiddle; other groups read and
// write the shared tile. BREV (the transform's last pass, out of place): LAST writes
// index i to dst[brev(i)] times the output factor, the bit reversal fused in.
template <int R, bool FIRST, bool LAST, bool BREV = false>
__device__ __forceinline__ void stage_group(const Tile& t, fr_t* smem, const Roots& w,
                                            uint32_t first, const OutFactor& out = OutFactor{}) {
    constexpr int ROWS = 1 << R;
    const uint32_t d = t.k - first - R;  // LAST: 0
    const uint32_t small_shift = MAX_PASS_LOG - t.k;
    const uint32_t mask_t = (1u << t.log_t) - 1;
    const uint32_t vthreads = 1u << (t.k - R + t.log_t);
    for (uint32_t v = threadIdx.x; v < vthreads; v += blockDim.x) {
        const uint32_t col = v & mask_t, rest = v >> t.log_t;
        const uint32_t low = rest & ((1u << d) - 1);
        const uint32_t row0 = ((rest >> d) << (t.k - first)) + low;
        fr_t x[ROWS];
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            const uint32_t row = row0 + ((uint32_t)i << d);
            if (FIRST) {
                const size_t idx = t.base + ((size_t)row << t.c) + col;
                x[i] = t.src[idx];
                if (w.coset_hi != nullptr)  // coset input: coefficient idx times g^idx
                    x[i] = x[i] * table_pow(w.coset_hi, w.coset_lo, (uint32_t)idx);
            } else {
                x[i] = smem[(row << t.log_t) + col];
            }
        }
#pragma unroll
        for (int s = 0; s < R; s++) {
            const int h = ROWS >> (s + 1);  // register distance of this stage's pairs
            const uint32_t shift = small_shift + first + s;
#pragma unroll
            for (int i = 0; i < ROWS; i++) {
                if (i & h) continue;
                const fr_t a0 = x[i], a1 = x[i + h];
                x[i] = a0 + a1;
                fr_t diff = a0 - a1;
                // The pair's offset in its half-block: j = ((i mod h) << d) + low.
                if (LAST) {  // known here: skip the w^0 = 1 products
                    if ((i & (h - 1)) != 0) diff = diff * w.small[(uint32_t)(i & (h - 1)) << shift];
                } else {
                    diff = diff * w.small[((((uint32_t)(i & (h - 1))) << d) + low) << shift];
                }
                x[i + h] = diff;
            }
        }
        if (LAST && t.c > 0) {  // all twiddles before any store: the stores may alias
#pragma unroll
            for (int i = 0; i < ROWS; i++) x[i] = four_step(t, w, row0 + i, t.lo0 + col, x[i]);
        }
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            const uint32_t row = row0 + ((uint32_t)i << d);
            const size_t idx = t.base + ((size_t)row << t.c) + col;
            if (LAST && BREV) {
                const uint32_t j = brev((uint32_t)idx, t.log_n);
                t.dst[j] = out.any() ? x[i] * bitrev_factor(j, out.has_scale, out.scale, out.hi, out.lo) : x[i];
            } else if (LAST) {
                t.dst[idx] = x[i];
            } else {
                smem[(row << t.log_t) + col] = x[i];
            }
        }
    }
}

// Size of the first stage group of a k-stage pass; the others have MAX_GROUP stages.
__device__ __forceinline__ uint32_t first_group(uint32_t k) {
    const uint32_t rem = k % MAX_GROUP;
    return rem == 0 ? MAX_GROUP : rem;
}

// One pass of k DIF stages from src to dst (equal: in place). Tile: 2^k rows × T =
// 2^log_t consecutive columns. A block holds blockDim.y tiles (several small
// sub-problems in the last pass, where c = 0), tile number blockIdx.x·blockDim.y +
// threadIdx.y; dynamic shared memory 2^k·T fr_t per tile (unused when k <= MAX_GROUP).
//
// BREV: the transform's last pass (c = 0, one column), writing each output to its
// bit-reversed index in dst, which must not overlap src. Tile number q takes the
// sub-problem brev(q), so that a block's consecutive tiles write consecutive indices
// (brev(sub·2^k + row) = brev_k(row)·2^(log_n-k) + q).
template <bool BREV>
__device__ __forceinline__ void dif_pass(const fr_t* src, fr_t* dst, uint32_t log_n, uint32_t done,
                                         uint32_t k, uint32_t log_t, const Roots& w,
                                         const OutFactor& out) {
    static_assert(MAX_GROUP == 2, "the group dispatch below covers groups of 1 and 2 stages");
    extern __shared__ fr_t smem_all[];
    fr_t* smem = smem_all + ((size_t)threadIdx.y << (k + log_t));
    const uint32_t tile = blockIdx.x * blockDim.y + threadIdx.y;
    Tile t;
    t.src = src;
    t.dst = dst;
    t.log_n = log_n;
    t.log_m = log_n - done;
    t.k = k;
    t.c = t.log_m - k;
    t.log_t = log_t;
    const uint32_t log_groups = t.c - log_t;  // column groups per sub-problem
    const size_t sub = BREV ? brev(tile, log_n - k) : tile >> log_groups;
    t.lo0 = BREV ? 0 : (tile & ((1u << log_groups) - 1)) << log_t;
    t.base = (sub << t.log_m) + t.lo0;

    const uint32_t r0 = first_group(k);
    if (r0 == k) {  // a single group: global to global
        if (k == 1) stage_group<1, true, true, BREV>(t, smem, w, 0, out);
        else stage_group<2, true, true, BREV>(t, smem, w, 0, out);
        return;
    }
    if (r0 == 1) stage_group<1, true, false>(t, smem, w, 0);
    else stage_group<2, true, false>(t, smem, w, 0);
    uint32_t first = r0;
    for (; first + MAX_GROUP < k; first += MAX_GROUP) {
        __syncthreads();
        stage_group<2, false, false>(t, smem, w, first);
    }
    __syncthreads();
    stage_group<2, false, true, BREV>(t, smem, w, first, out);
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
    auto factor = [&](uint32_t idx) { return bitrev_factor(idx, has_scale, scale, hi, lo); };
    const fr_t xi = data[i];
    if (i == j) {
        if (scaled) data[i] = xi * factor(i);
        return;
    }
    const fr_t xj = data[j];
    data[i] = scaled ? xj * factor(i) : xj;
    data[j] = scaled ? xi * factor(j) : xi;
}

// The same permutation and factors in tiles, so that every global access is a run of
// 2^BITREV_TILE_LOG consecutive elements (512 bytes) rather than a lone 32-byte gather
// (bitrev_scale reached 47 % of the DRAM bandwidth at 2^24). For log_n >= 2·BITREV_TILE_LOG
// write j = [x | m | y], x and y of BITREV_TILE_LOG bits, x on top: brev(j) =
// [brev(y) | brev(m) | brev(x)], so tile m (all x, y) lands transposed in tile brev(m).
// Block m handles the pair {m, brev(m)} when m <= brev(m), loading both tiles before it
// writes either (in place). BITREV_THREADS threads, one element of each tile each.
constexpr uint32_t BITREV_TILE_LOG = 4;
constexpr uint32_t BITREV_SIDE = 1u << BITREV_TILE_LOG;
constexpr uint32_t BITREV_THREADS = BITREV_SIDE * BITREV_SIDE;

__device__ __forceinline__ void bitrev_tiled(fr_t* __restrict__ data, uint32_t log_n, bool has_scale,
                                             const fr_t& scale, const fr_t* __restrict__ hi,
                                             const fr_t* __restrict__ lo) {
    // [tile][half][x][y], rows padded by one uint4 against the transposed reads' conflicts.
    __shared__ uint4 tile[2][2][BITREV_SIDE][BITREV_SIDE + 1];
    const uint32_t m_bits = log_n - 2 * BITREV_TILE_LOG;
    const uint32_t m = blockIdx.x, mr = brev(m, m_bits);
    if (m > mr || threadIdx.x >= BITREV_THREADS) return;  // the pair's other block works
    const uint32_t x_shift = log_n - BITREV_TILE_LOG;
    const uint32_t x = threadIdx.x >> BITREV_TILE_LOG, y = threadIdx.x & (BITREV_SIDE - 1);
    const uint32_t tiles = m == mr ? 1 : 2;
    auto at = [&](uint32_t tm, uint32_t row, uint32_t col) {
        return ((size_t)row << x_shift) | ((size_t)tm << BITREV_TILE_LOG) | col;
    };
    for (uint32_t q = 0; q < tiles; q++) {
        const uint4* src = reinterpret_cast<const uint4*>(data + at(q == 0 ? m : mr, x, y));
        tile[q][0][x][y] = src[0];
        tile[q][1][x][y] = src[1];
    }
    __syncthreads();
    const bool scaled = has_scale || hi != nullptr;
    const uint32_t sx = brev(y, BITREV_TILE_LOG), sy = brev(x, BITREV_TILE_LOG);
    for (uint32_t q = 0; q < tiles; q++) {
        // Tile m's element (sx, sy) goes to tile mr at (x, y), and tile mr's to tile m.
        const size_t j = at(q == 0 ? mr : m, x, y);
        fr_t v;
        uint4* p = reinterpret_cast<uint4*>(&v);
        p[0] = tile[q][0][sx][sy];
        p[1] = tile[q][1][sx][sy];
        if (scaled) v = v * bitrev_factor((uint32_t)j, has_scale, scale, hi, lo);
        data[j] = v;
    }
}
}  // namespace ntt
