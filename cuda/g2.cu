// G2 kernels over BLS12-381: msm.cuh's batch addition, chunk sums and Pippenger point
// stages (bucket accumulation, head folding, bucket reduction) instantiated for points
// over fp2_t (G2: y^2 = x^3 + 4(u + 1), a = 0, so curve.cuh's formulas apply as they
// are). The Pippenger stages read the sorted entries of a G1 split MSM on the same
// scalars (B_G1's, for B_G2): the digits and the sort are scalar work, done once.
// Host side: src/device/cuda/g2.rs and msm/ (kernel names there).
#include "fp2.cuh"
#include "msm.cuh"

typedef affine_t<fp2_t> g2_affine_t;
typedef xyzz_t<fp2_t> g2_xyzz_t;

static_assert(sizeof(g2_affine_t) == 192, "g2_affine_t must be 192 bytes (layout.rs DevG2Affine)");
static_assert(sizeof(g2_xyzz_t) == 384, "g2_xyzz_t must be 384 bytes (layout.rs DevG2Xyzz)");

// Block size; g2.rs launches with the same number and sizes the grid by the occupancy
// the driver reports. An XYZZ accumulator over Fq2 is 96 registers alone: the kernels
// use 180 to 255 registers a thread (see fp2.cuh), so an SM holds few warps whatever
// the block size, and small blocks keep the last, partial wave short.
#define G2_BLOCK 64

// Thread t: out[t] = sum of bases[i] over the set bits i < n of
// bitmap[t*words .. (t+1)*words).
extern "C" __global__ void __launch_bounds__(G2_BLOCK)
    g2_batch_add_bitmap(g2_xyzz_t* out, const g2_affine_t* bases, const uint32_t* bitmap, uint32_t n,
                        uint32_t words) {
    msm::batch_add_bitmap(out, bases, bitmap, n, words);
}

// Thread t: out[t] = sum of in[t*chunk .. min((t+1)*chunk, len)); grid.y = 1.
extern "C" __global__ void __launch_bounds__(G2_BLOCK)
    g2_sum_chunks(g2_xyzz_t* out, const g2_xyzz_t* in, uint32_t len, uint32_t chunk) {
    msm::sum_chunks(out, in, len, chunk);
}

// The Pippenger point stages over G2: msm.cu's msm_accumulate_sorted, msm_accumulate_heads
// and msm_reduce_buckets with G2 points (same parameters).
extern "C" __global__ void __launch_bounds__(G2_BLOCK)
    g2_accumulate_sorted(g2_xyzz_t* buckets, uint32_t* head_keys, g2_xyzz_t* head_pts, const uint32_t* sorted,
                         const uint32_t* offsets, const g2_affine_t* bases, uint32_t K, uint32_t S) {
    msm::accumulate_sorted<fp2_t, G2_BLOCK>(buckets, head_keys, head_pts, sorted, offsets, bases, K, S);
}

extern "C" __global__ void __launch_bounds__(G2_BLOCK)
    g2_accumulate_heads(g2_xyzz_t* buckets, uint32_t* out_keys, g2_xyzz_t* out_pts, const uint32_t* in_keys,
                        const g2_xyzz_t* in_pts, uint32_t count, uint32_t T) {
    msm::accumulate_heads(buckets, out_keys, out_pts, in_keys, in_pts, count, T);
}

extern "C" __global__ void __launch_bounds__(G2_BLOCK)
    g2_reduce_buckets(g2_xyzz_t* out, const g2_xyzz_t* buckets, const uint32_t* offsets, uint32_t c,
                      uint32_t w_count, uint32_t L) {
    msm::reduce_buckets(out, buckets, offsets, c, w_count, L);
}
