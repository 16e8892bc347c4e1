// Pippenger multi-scalar multiplication and batch addition, templated on the point
// types of curve.cuh. msm.cu instantiates them for G1 and exports the kernels; g2.cu
// instantiates batch_add_bitmap and sum_chunks for G2 (over fp2_t).
//
// Pipeline (one kernel per stage; the host in src/device/cuda/msm/ drives it for a
// group of windows at a time):
//
//   (a) from_montgomery   Montgomery-form Fr (arkworks bytes) -> canonical integer < r.
//       digits            canonical scalar -> signed c-bit digits, one array per window.
//   (b) bucket_count      histogram of keys (window, |digit|) over nonzero digits.
//       scan_*            exclusive prefix sum of the histogram -> bucket offsets.
//       bucket_scatter    (base index | sign) entries placed at their bucket's offsets:
//                         a counting sort by key.
//   (c') halve_counts,    optional (G1): R rounds that add each bucket's points pairwise
//        pair_round       in affine form, one field inversion shared by ~256 pairs
//                         (Montgomery's trick), halving the points (c) then adds.
//   (c) accumulate_sorted each thread sums an equal-length slice of the sorted entries
//                         (mixed XYZZ + affine adds, negated for negative digits), so a
//                         heavy bucket is spread over many threads. A bucket whose run
//                         starts in the slice is written by that thread; the pieces of a
//                         run that started earlier go to a "head" list, which
//                         accumulate_heads folds back level by level. The next base is
//                         prefetched (cp.async into shared memory) during each addition.
//   (d) reduce_buckets    per window, sum_j j*B_j by running sums over groups of L
//                         buckets, each group then scaled by its offset; sum_chunks folds
//                         the groups to one point per window.
//   (e) the combination Σ_w 2^(cw)·W_w runs on the host (msm/ `combine_windows`):
//                         one chain of ~255 dependent doublings is latency-bound on one
//                         GPU thread (8.6 ms) and takes ~0.1 ms on a CPU core.
//
// Signed digits: with a window of c bits, k = sum_w d_w 2^(cw), d_w in
// [-(2^(c-1) - 1), 2^(c-1)], bucket |d_w| in 1..2^(c-1); a zero digit lands in no
// bucket. A window's raw value v (plus the carry from below) that exceeds 2^(c-1)
// becomes v - 2^c and carries one into the next window. Because k < r < 2^255 and the
// host picks the window count W with c*W >= 256, the top window has at most c-1 bits,
// so its value plus a carry is at most 2^(c-1): no carry leaves the top window.
//
// Encodings: a digit and a sorted entry are one u32, bit 31 = negative, the low 31 bits
// = magnitude (digit) or base index (entry). Keys are wl * NB + (|d| - 1) with
// NB = 2^(c-1) and wl the window's index within the current group.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_pipeline.h>

#include "curve.cuh"

namespace msm {

constexpr uint32_t NEG = 0x80000000u;
constexpr uint32_t MAG = 0x7fffffffu;
// No key (an empty head slot).
constexpr uint32_t NO_KEY = 0xffffffffu;
constexpr unsigned FULL_MASK = 0xffffffffu;

// Out-of-line point ops for the stages off the hot path (head folding, reduction,
// chunk sums): each inlined copy of the complete XYZZ addition costs nvcc tens of
// seconds, and these stages do a small share of the additions. The hot loops
// (accumulate_sorted, batch_add_bitmap) inline xyzz_add_affine once each.
template <class F>
__device__ __noinline__ void add_ool(xyzz_t<F>& p, const xyzz_t<F>& q) {
    xyzz_add(p, q);
}
template <class F>
__device__ __noinline__ void dbl_ool(xyzz_t<F>& p) {
    xyzz_dbl(p);
}

// ---------------------------------------------------------------------------------
// (a) scalars

// arkworks stores a·R mod r; a Montgomery product with the plain integer 1 gives
// a·R·1·R^-1 = a, fully reduced (< r).
template <class Fr>
__device__ __forceinline__ void from_montgomery(Fr* out, const Fr* in, uint32_t n) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Fr one_raw = Fr::zero();
    one_raw.v[0] = 1;
    out[i] = in[i] * one_raw;
}

// Bits [off, off + c) of a 256-bit little-endian integer, zero past bit 255; c <= 31.
__device__ __forceinline__ uint32_t window_bits(const uint32_t s[8], uint32_t off, uint32_t c) {
    const uint32_t limb = off >> 5, shift = off & 31;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (uint32_t i = 0; i < 8; i++) {  // selects, not a dynamic index: s stays in registers
        lo = i == limb ? s[i] : lo;
        hi = i == limb + 1 ? s[i] : hi;
    }
    const uint64_t v = ((uint64_t)hi << 32 | lo) >> shift;
    return (uint32_t)v & ((1u << c) - 1);
}

// digits[(w - w_begin) * n + i] = digit w of scalar i, for w in [w_begin, w_begin +
// w_count). The carry runs from window 0, so every window below w_begin is recomputed.
__device__ __forceinline__ void digits(uint32_t* __restrict__ out, const uint32_t* __restrict__ scalars,
                                       uint32_t n, uint32_t c, uint32_t w_begin, uint32_t w_count) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t s[8];
    const uint4* src = reinterpret_cast<const uint4*>(scalars) + 2 * (size_t)i;
    const uint4 a = src[0], b = src[1];
    s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w, s[4] = b.x, s[5] = b.y, s[6] = b.z, s[7] = b.w;
    const uint32_t half = 1u << (c - 1), full = 1u << c;
    uint32_t carry = 0;
    for (uint32_t w = 0; w < w_begin + w_count; w++) {
        const uint32_t v = window_bits(s, w * c, c) + carry;  // <= 2^c
        uint32_t d;
        if (v > half) {
            d = NEG | (full - v);  // v - 2^c in [-(2^(c-1) - 1), 0]; 0 when v = 2^c
            carry = 1;
        } else {
            d = v;
            carry = 0;
        }
        if ((d & MAG) == 0) d = 0;  // no negative zero
        if (w >= w_begin) out[(size_t)(w - w_begin) * n + i] = d;
    }
}

// ---------------------------------------------------------------------------------
// (b) counting sort by key

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31; }

// counts[key] += 1 for each nonzero digit. Lanes of a warp with the same key add once
// (all-equal scalars would otherwise serialize on one address).
__device__ __forceinline__ void bucket_count(uint32_t* __restrict__ counts, const uint32_t* __restrict__ digits,
                                             uint32_t n, uint32_t c) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t wl = blockIdx.y;
    const uint32_t d = i < n ? digits[(size_t)wl * n + i] : 0;
    const bool valid = (d & MAG) != 0;
    const unsigned active = __ballot_sync(FULL_MASK, valid);
    if (!valid) return;
    const uint32_t key = (wl << (c - 1)) + (d & MAG) - 1;
    const unsigned peers = __match_any_sync(active, key);
    if (lane_id() == (uint32_t)__ffs(peers) - 1) atomicAdd(&counts[key], (uint32_t)__popc(peers));
}

// sorted[cursor[key]++] = base index | sign, for each nonzero digit. `base_index` maps a
// scalar's position to its base (the split MSM's compacted "other" scalars); nullptr is
// the identity. Order within a bucket depends on scheduling; bucket sums do not.
__device__ __forceinline__ void bucket_scatter(uint32_t* __restrict__ sorted, uint32_t* __restrict__ cursor,
                                               const uint32_t* __restrict__ digits,
                                               const uint32_t* __restrict__ base_index, uint32_t n,
                                               uint32_t c) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t wl = blockIdx.y;
    const uint32_t d = i < n ? digits[(size_t)wl * n + i] : 0;
    const bool valid = (d & MAG) != 0;
    const unsigned active = __ballot_sync(FULL_MASK, valid);
    if (!valid) return;
    const uint32_t key = (wl << (c - 1)) + (d & MAG) - 1;
    const unsigned peers = __match_any_sync(active, key);
    const uint32_t leader = __ffs(peers) - 1;
    uint32_t base = 0;
    if (lane_id() == leader) base = atomicAdd(&cursor[key], (uint32_t)__popc(peers));
    base = __shfl_sync(peers, base, leader);
    const uint32_t rank = __popc(peers & ((1u << lane_id()) - 1));
    const uint32_t index = base_index ? base_index[i] : i;
    sorted[base + rank] = index | (d & NEG);
}

// Exclusive prefix sum over counts[0..K) in three kernels: tile sums, a one-block scan
// of the tile sums, then each tile scanned again with its prefix added.
constexpr uint32_t SCAN_THREADS = 256;
constexpr uint32_t SCAN_ITEMS = 8;
constexpr uint32_t SCAN_TILE = SCAN_THREADS * SCAN_ITEMS;

// Exclusive scan of one value per thread across a block of SCAN_THREADS; *total gets
// the block's sum. All threads must call it.
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t x, uint32_t* total) {
    __shared__ uint32_t warp_sums[SCAN_THREADS / 32];
    __shared__ uint32_t block_total;
    const uint32_t lane = lane_id(), warp = threadIdx.x >> 5;
    uint32_t inc = x;
#pragma unroll
    for (uint32_t o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const uint32_t w = lane < SCAN_THREADS / 32 ? warp_sums[lane] : 0;
        uint32_t winc = w;
#pragma unroll
        for (uint32_t o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(FULL_MASK, winc, o);
            if (lane >= o) winc += y;
        }
        if (lane < SCAN_THREADS / 32) warp_sums[lane] = winc - w;
        if (lane == 31) block_total = winc;
    }
    __syncthreads();
    const uint32_t r = warp_sums[warp] + inc - x;
    *total = block_total;
    __syncthreads();  // the shared slots may be reused by the next call
    return r;
}

__device__ __forceinline__ void scan_reduce(uint32_t* __restrict__ tile_sums, const uint32_t* __restrict__ counts,
                                            uint32_t K) {
    const size_t first = (size_t)blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
    uint32_t s = 0;
#pragma unroll
    for (uint32_t j = 0; j < SCAN_ITEMS; j++)
        if (first + j < K) s += counts[first + j];
    uint32_t total;
    block_exclusive_scan(s, &total);
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// One block: tile_sums[0..tiles) becomes its exclusive prefix sum.
__device__ __forceinline__ void scan_tiles(uint32_t* tile_sums, uint32_t tiles) {
    uint32_t carry = 0;
    for (uint32_t start = 0; start < tiles; start += SCAN_THREADS) {
        const uint32_t i = start + threadIdx.x;
        const uint32_t x = i < tiles ? tile_sums[i] : 0;
        uint32_t total;
        const uint32_t e = block_exclusive_scan(x, &total);
        if (i < tiles) tile_sums[i] = carry + e;
        carry += total;
    }
}

// offsets[i] = cursor[i] = sum of counts[0..i); offsets[K] = the total. `cursor` may be
// `counts` itself (each thread reads its items before it writes them).
__device__ __forceinline__ void scan_apply(uint32_t* __restrict__ offsets, uint32_t* cursor, const uint32_t* counts,
                                           const uint32_t* __restrict__ tile_sums, uint32_t K) {
    const size_t first = (size_t)blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
    uint32_t items[SCAN_ITEMS];
    uint32_t s = 0;
#pragma unroll
    for (uint32_t j = 0; j < SCAN_ITEMS; j++) {
        items[j] = first + j < K ? counts[first + j] : 0;
        s += items[j];
    }
    uint32_t total;
    uint32_t run = tile_sums[blockIdx.x] + block_exclusive_scan(s, &total);
#pragma unroll
    for (uint32_t j = 0; j < SCAN_ITEMS; j++) {
        if (first + j < K) {
            offsets[first + j] = run;
            cursor[first + j] = run;
            if (first + j == K - 1) offsets[K] = run + items[j];
        }
        run += items[j];
    }
}

// ---------------------------------------------------------------------------------
// (c) bucket accumulation

// The bucket k holding sorted position pos: offsets[k] <= pos < offsets[k + 1].
// Requires pos < offsets[K].
__device__ __forceinline__ uint32_t bucket_of(const uint32_t* offsets, uint32_t K, uint32_t pos) {
    uint32_t lo = 0, hi = K;  // offsets[lo] <= pos < offsets[hi]
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (offsets[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

// Threads per block of msm_accumulate_sorted (msm.cu launches it with MSM_BLOCK_POINT,
// which must not exceed this): sizes the shared staging of accumulate_sorted. g2.cu
// instantiates accumulate_sorted with its own (smaller) block.
constexpr uint32_t ACCUMULATE_THREADS = 128;

// A thread's base prefetch area in shared memory: two slots (double buffering) of one
// affine point as 16-byte chunks, chunk-major so a warp's accesses hit distinct banks.
template <class F, uint32_t THREADS = ACCUMULATE_THREADS>
struct BaseStage {
    static constexpr uint32_t CHUNKS = sizeof(affine_t<F>) / 16;
    uint4 chunk[2][CHUNKS][THREADS];
};

// Starts the asynchronous copy (cp.async) of *src into slot `slot` of this thread.
template <class F, uint32_t THREADS>
__device__ __forceinline__ void stage_base(BaseStage<F, THREADS>& st, uint32_t slot, const affine_t<F>* src) {
    const uint4* from = reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (uint32_t j = 0; j < BaseStage<F, THREADS>::CHUNKS; j++)
        __pipeline_memcpy_async(&st.chunk[slot][j][threadIdx.x], &from[j], 16);
    __pipeline_commit();
}

// The point in slot `slot` (its copy must have completed).
template <class F, uint32_t THREADS>
__device__ __forceinline__ affine_t<F> staged_base(const BaseStage<F, THREADS>& st, uint32_t slot) {
    affine_t<F> p;
    uint4* to = reinterpret_cast<uint4*>(&p);
#pragma unroll
    for (uint32_t j = 0; j < BaseStage<F, THREADS>::CHUNKS; j++) to[j] = st.chunk[slot][j][threadIdx.x];
    return p;
}

// The sorted entries are cut into S slices of T = ceil(total / S) entries (total =
// offsets[K], read here so the host need not wait for it); thread s < S sums slice s,
// bucket by bucket. For each run of one bucket k in the slice:
//   - the run starts in the slice: buckets[k] = its sum here (k's owner, sole writer);
//   - the run started in an earlier slice (only the slice's first run): the sum goes to
//     head_keys[s] = k, head_pts[s]; accumulate_heads adds it to buckets[k] later.
// head_keys[s] = NO_KEY when the slice is empty or starts a run. Buckets with no
// entries are never written: readers test offsets[k] == offsets[k + 1].
//
// The bases are a random 96-byte gather. One loop over the slice is software-pipelined
// across bucket boundaries: while entry q is added, the base of q + 1 is copying into
// shared memory (cp.async, so it holds no registers: the addition already needs about
// 160) and the entry q + 2 is loading. Reads past the slice's end re-read entry b - 1
// (in bounds, unused), so they need no branch.
//
// DIRECT: there are no entries; position q holds the point bases[q] itself (the points
// the batch-affine rounds below leave), never negated. `sorted` is unused.
template <class F, uint32_t THREADS = ACCUMULATE_THREADS, bool DIRECT = false>
__device__ __forceinline__ void accumulate_sorted(xyzz_t<F>* __restrict__ buckets, uint32_t* __restrict__ head_keys,
                                                  xyzz_t<F>* __restrict__ head_pts, const uint32_t* __restrict__ sorted,
                                                  const uint32_t* __restrict__ offsets,
                                                  const affine_t<F>* __restrict__ bases, uint32_t K, uint32_t S) {
    __shared__ BaseStage<F, THREADS> stage;  // blockDim.x <= THREADS
    const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const uint32_t total = offsets[K];
    const uint32_t T = total / S + (total % S != 0);
    const size_t a64 = (size_t)s * T;
    if (a64 >= total) {
        head_keys[s] = NO_KEY;
        return;
    }
    const uint32_t a = (uint32_t)a64;
    const uint32_t b = (uint32_t)min((size_t)total, a64 + T);
    uint32_t k = bucket_of(offsets, K, a);
    // The slice's first run is a head when bucket k's run started in an earlier slice;
    // k only grows, so the accumulator belongs to the head exactly while k == head_key.
    const uint32_t head_key = offsets[k] < a ? k : NO_KEY;
    auto entry = [&](uint32_t pos) { return DIRECT ? pos : sorted[pos]; };
    head_keys[s] = head_key;
    uint32_t stop = min(offsets[k + 1], b);  // end of bucket k's run in the slice
    uint32_t e = entry(a);
    bool neg = e & NEG;
    stage_base(stage, a & 1, &bases[e & MAG]);  // entry q's base goes to slot q & 1
    e = entry(min(a + 1, b - 1));  // from here on, e is entry q + 1
    xyzz_t<F> acc = xyzz_inf<F>();
    for (uint32_t q = a; q < b; q++) {
        stage_base(stage, (q + 1) & 1, &bases[e & MAG]);
        const bool neg_next = e & NEG;
        e = entry(min(q + 2, b - 1));
        __pipeline_wait_prior(1);  // entry q's copy (all but the newest) has landed
        affine_t<F> pt = staged_base(stage, q & 1);
        if (neg) affine_neg(pt);
        xyzz_add_affine(acc, pt);  // the kernel's only inlined addition
        if (q + 1 == stop) {  // bucket k's run ends here: store it and move to the next
            if (k == head_key)
                head_pts[s] = acc;
            else
                buckets[k] = acc;
            acc = xyzz_inf<F>();
            if (stop < b) {
                k++;
                while (offsets[k + 1] <= stop) k++;  // skip empty buckets; ends below K as stop < total
                stop = min(offsets[k + 1], b);
            }
        }
        neg = neg_next;
    }
    __pipeline_wait_prior(0);  // no copy may still write shared memory at exit
}

// One level of folding heads into buckets. Equal keys in `in_keys[0..count)` are
// contiguous (a bucket's heads come from consecutive slices). Thread s takes slots
// [s*T, (s+1)*T); for each run of one key k there:
//   - the run starts in this slice: buckets[k] += its sum (bucket k was written by its
//     owner in accumulate_sorted, and no other thread of this level touches it);
//   - the run continues from the previous slice: the sum goes to out_keys[s], out_pts[s].
// out_keys[s] = NO_KEY otherwise. Repeat with the outputs until one slice remains.
template <class F>
__device__ __forceinline__ void accumulate_heads(xyzz_t<F>* __restrict__ buckets, uint32_t* __restrict__ out_keys,
                                                 xyzz_t<F>* __restrict__ out_pts, const uint32_t* __restrict__ in_keys,
                                                 const xyzz_t<F>* __restrict__ in_pts, uint32_t count, uint32_t T) {
    const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    const size_t a64 = (size_t)s * T;
    if (a64 >= count) return;
    const uint32_t a = (uint32_t)a64;
    const uint32_t b = (uint32_t)min((size_t)count, a64 + T);
    uint32_t out_key = NO_KEY;
    uint32_t p = a;
    while (p < b) {
        const uint32_t k = in_keys[p];
        if (k == NO_KEY) {
            p++;
            continue;
        }
        xyzz_t<F> acc = in_pts[p];
        uint32_t q = p + 1;
        for (; q < b && in_keys[q] == k; q++) add_ool(acc, in_pts[q]);
        if (p == a && a > 0 && in_keys[a - 1] == k) {
            out_key = k;
            out_pts[s] = acc;
        } else {
            xyzz_t<F> sum = buckets[k];
            add_ool(sum, acc);
            buckets[k] = sum;
        }
        p = q;
    }
    out_keys[s] = out_key;
}

// ---------------------------------------------------------------------------------
// (c') batch-affine rounds (G1, optional: the host runs R of them before (c))
//
// A mixed XYZZ addition costs ten field products. An affine addition costs three once
// 1/(x2 - x1) is known, and Montgomery's trick gives m inverses for one inversion and
// three products each. So before (c), R rounds add each bucket's points pairwise in
// affine form: round r turns a bucket's run of m points into ceil(m/2) (an odd one out
// is copied), about halving the points that (c) then adds in XYZZ. A round's input is
// the sorted entries with the bases (round 0) or the previous round's points; its
// output offsets are the exclusive scan of halve_counts. (c) then runs on the last
// round's points (accumulate_sorted with DIRECT).

// Round 0 reads the sorted entries (base index | sign) and the bases; x() is all the
// forward pass needs in the common case (negation leaves x alone).
template <class F>
struct EntryPoints {
    const uint32_t* __restrict__ sorted;
    const affine_t<F>* __restrict__ bases;
    __device__ __forceinline__ F x(uint32_t pos) const { return bases[sorted[pos] & MAG].x; }
    __device__ __forceinline__ affine_t<F> operator()(uint32_t pos) const {
        const uint32_t e = sorted[pos];
        affine_t<F> p = bases[e & MAG];
        if (e & NEG) affine_neg(p);
        return p;
    }
};

// Later rounds read the previous round's points.
template <class F>
struct ListPoints {
    const affine_t<F>* __restrict__ pts;
    __device__ __forceinline__ F x(uint32_t pos) const { return pts[pos].x; }
    __device__ __forceinline__ affine_t<F> operator()(uint32_t pos) const { return pts[pos]; }
};

// counts[k] = ceil(m_k / 2), m_k = in_off[k + 1] - in_off[k]: a round's output run lengths.
__device__ __forceinline__ void halve_counts(uint32_t* __restrict__ counts, const uint32_t* __restrict__ in_off,
                                             uint32_t K) {
    const uint32_t k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < K) counts[k] = (in_off[k + 1] - in_off[k] + 1) / 2;
}

// How a + b is formed: through λ = num/den, or without a division.
enum PairKind : uint32_t { VIA_LAMBDA, TAKE_A, TAKE_B, TAKE_INF };

// Classifies a + b (b = infinity for an odd one out) and sets num, den when λ is needed:
// chord (x1 != x2), tangent (a == b; G1 has no point with y = 0), or none (an infinity
// on either side, a == -b).
template <class F>
__device__ __forceinline__ PairKind pair_terms(const affine_t<F>& a, const affine_t<F>& b, F& num, F& den) {
    num = F::zero();
    den = F::one();
    if (is_inf(b)) return TAKE_A;
    if (is_inf(a)) return TAKE_B;
    if (a.x != b.x) {
        num = b.y - a.y;
        den = b.x - a.x;
        return VIA_LAMBDA;
    }
    if (a.y == b.y) {
        const F xx = a.x.sqr();
        num = xx + xx.dbl();
        den = a.y.dbl();
        return VIA_LAMBDA;
    }
    return TAKE_INF;
}

// One round. Output slot j of bucket k (out_off[k] <= j < out_off[k + 1]) is the sum of
// input positions p = in_off[k] + 2(j - out_off[k]) and p + 1, or p alone when p + 1
// leaves the run. Thread s < S takes T = ceil(total / S) consecutive slots (total =
// out_off[K], read here so the host need not wait for it) and inverts their
// denominators together: a forward pass stores prefix products (prefix[(j-a)·S + s],
// coalesced across threads), one inversion, a backward pass forms the sums.
// The forward pass reads only x where it can: two x that differ and are nonzero
// (infinity is (0, 0)) mean a chord, whose denominator is their difference.
template <class F, class Source>
__device__ __forceinline__ void pair_round(affine_t<F>* __restrict__ out, F* __restrict__ prefix,
                                           const uint32_t* __restrict__ in_off, const uint32_t* __restrict__ out_off,
                                           Source src, uint32_t K, uint32_t S) {
    const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const uint32_t total = out_off[K];
    const uint32_t T = total / S + (total % S != 0);
    const size_t a64 = (size_t)s * T;
    if (a64 >= total) return;
    const uint32_t a = (uint32_t)a64;
    const uint32_t b = (uint32_t)min((size_t)total, a64 + T);
    uint32_t k = bucket_of(out_off, K, a);
    F acc = F::one();
    for (uint32_t j = a; j < b; j++) {
        while (out_off[k + 1] <= j) k++;  // ends below K: j < total
        const uint32_t p = in_off[k] + 2 * (j - out_off[k]);
        if (p + 1 >= in_off[k + 1]) continue;  // copied: no denominator
        const F x1 = src.x(p), x2 = src.x(p + 1);
        F num, den = x2 - x1;
        if (x1 == x2 || x1.is_zero() || x2.is_zero()) {
            if (pair_terms(src(p), src(p + 1), num, den) != VIA_LAMBDA) continue;
        }
        prefix[(size_t)(j - a) * S + s] = acc;
        acc = acc * den;
    }
    F inv = acc.inverse();  // of the product of every denominator of the slice
    for (uint32_t j = b; j-- > a;) {
        while (out_off[k] > j) k--;
        const uint32_t p = in_off[k] + 2 * (j - out_off[k]);
        const affine_t<F> p1 = src(p);
        const affine_t<F> p2 = p + 1 < in_off[k + 1] ? src(p + 1) : affine_inf<F>();
        F num, den;
        const PairKind kind = pair_terms(p1, p2, num, den);
        affine_t<F> r;
        if (kind == VIA_LAMBDA) {
            const F lambda = num * (inv * prefix[(size_t)(j - a) * S + s]);
            inv = inv * den;  // now the inverse of the product of the denominators before j
            r.x = lambda.sqr() - p1.x - p2.x;
            r.y = lambda * (p1.x - r.x) - p1.y;
        } else {
            r = kind == TAKE_A ? p1 : kind == TAKE_B ? p2 : affine_inf<F>();
        }
        out[j] = r;
    }
}

// ---------------------------------------------------------------------------------
// (d) bucket reduction

// e·p by double-and-add.
template <class F>
__device__ __forceinline__ xyzz_t<F> xyzz_mul_u32(const xyzz_t<F>& p, uint32_t e) {
    xyzz_t<F> acc = xyzz_inf<F>();
    for (int bit = 31 - __clz(e); bit >= 0; bit--) {
        dbl_ool(acc);
        if ((e >> bit) & 1) add_ool(acc, p);
    }
    return acc;
}

// Thread (wl, g) of w_count * G, G = NB / L: out[wl*G + g] = sum over the group's
// buckets m = g*L + j (j = 1..L) of m·B_m, as running sums from the top bucket down:
// sum_j j·B_{gL+j} + gL·sum_j B_{gL+j}. Empty buckets (offsets equal) count as zero.
template <class F>
__device__ __forceinline__ void reduce_buckets(xyzz_t<F>* __restrict__ out, const xyzz_t<F>* __restrict__ buckets,
                                               const uint32_t* __restrict__ offsets, uint32_t c, uint32_t w_count,
                                               uint32_t L) {
    const uint32_t id = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t NB = 1u << (c - 1);
    const uint32_t G = NB / L;
    if (id >= w_count * G) return;
    const uint32_t wl = id / G, g = id % G;
    const uint32_t first = wl * NB + g * L;
    xyzz_t<F> running = xyzz_inf<F>();
    xyzz_t<F> sum = running;
    for (uint32_t j = L; j-- > 0;) {
        const uint32_t k = first + j;
        if (offsets[k] != offsets[k + 1]) add_ool(running, buckets[k]);
        add_ool(sum, running);
    }
    add_ool(sum, xyzz_mul_u32(running, g * L));
    out[id] = sum;
}

// Thread t of group gi (blockIdx.y): out[gi*ceil(len/chunk) + t] =
// sum of in[gi*len + t*chunk .. gi*len + min((t+1)*chunk, len)).
template <class F>
__device__ __forceinline__ void sum_chunks(xyzz_t<F>* __restrict__ out, const xyzz_t<F>* __restrict__ in, uint32_t len,
                                           uint32_t chunk) {
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t out_len = (len + chunk - 1) / chunk;
    if (t >= out_len) return;
    const size_t gi = blockIdx.y;
    const uint32_t from = t * chunk, to = min(len, from + chunk);
    const xyzz_t<F>* src = in + gi * len;
    xyzz_t<F> acc = src[from];
    for (uint32_t q = from + 1; q < to; q++) add_ool(acc, src[q]);
    out[gi * out_len + t] = acc;
}

// ---------------------------------------------------------------------------------
// batch addition (scalars equal to one)

// Thread t: out[t] = sum of bases[i] over the set bits i < n of
// bitmap[t*words .. (t+1)*words) (bit i of the bitmap is bit i%32 of word i/32).
template <class F>
__device__ __forceinline__ void batch_add_bitmap(xyzz_t<F>* __restrict__ out, const affine_t<F>* __restrict__ bases,
                                                 const uint32_t* __restrict__ bitmap, uint32_t n, uint32_t words) {
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t total_words = (n + 31) / 32;
    const uint32_t parts = (total_words + words - 1) / words;
    if (t >= parts) return;
    xyzz_t<F> acc = xyzz_inf<F>();
    const uint32_t end = min(total_words, (t + 1) * words);
    for (uint32_t w = t * words; w < end; w++) {
        uint32_t bits = bitmap[w];
        if (w == total_words - 1 && (n & 31)) bits &= (1u << (n & 31)) - 1;
        while (bits) {
            const uint32_t i = w * 32 + (__ffs(bits) - 1);
            bits &= bits - 1;
            xyzz_add_affine(acc, bases[i]);
        }
    }
    out[t] = acc;
}

}  // namespace msm
