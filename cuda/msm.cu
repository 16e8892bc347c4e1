// G1 multi-scalar multiplication kernels over BLS12-381: msm.cuh instantiated for
// fr_t scalars and g1 points. Host side: src/device/cuda/msm/ (kernel names in msm/mod.rs).
#include "msm.cuh"

// Block sizes; msm/mod.rs launches with the same numbers.
#define MSM_BLOCK_LIGHT 256  // integer-only stages
#define MSM_BLOCK_POINT 128  // stages that add points (high register use)

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_LIGHT)
    msm_from_montgomery(fr_t* out, const fr_t* in, uint32_t n) {
    msm::from_montgomery(out, in, n);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_LIGHT)
    msm_digits(uint32_t* out, const uint32_t* scalars, uint32_t n, uint32_t c, uint32_t w_begin,
               uint32_t w_count) {
    msm::digits(out, scalars, n, c, w_begin, w_count);
}

// grid.y = window within the group.
extern "C" __global__ void __launch_bounds__(MSM_BLOCK_LIGHT)
    msm_bucket_count(uint32_t* counts, const uint32_t* digits, uint32_t n, uint32_t c) {
    msm::bucket_count(counts, digits, n, c);
}

extern "C" __global__ void __launch_bounds__(msm::SCAN_THREADS)
    msm_scan_reduce(uint32_t* tile_sums, const uint32_t* counts, uint32_t K) {
    msm::scan_reduce(tile_sums, counts, K);
}

extern "C" __global__ void __launch_bounds__(msm::SCAN_THREADS)
    msm_scan_tiles(uint32_t* tile_sums, uint32_t tiles) {
    msm::scan_tiles(tile_sums, tiles);
}

extern "C" __global__ void __launch_bounds__(msm::SCAN_THREADS)
    msm_scan_apply(uint32_t* offsets, uint32_t* cursor, const uint32_t* counts, const uint32_t* tile_sums,
                   uint32_t K) {
    msm::scan_apply(offsets, cursor, counts, tile_sums, K);
}

// grid.y = window within the group.
extern "C" __global__ void __launch_bounds__(MSM_BLOCK_LIGHT)
    msm_bucket_scatter(uint32_t* sorted, uint32_t* cursor, const uint32_t* digits, const uint32_t* base_index,
                       uint32_t n, uint32_t c) {
    msm::bucket_scatter(sorted, cursor, digits, base_index, n, c);
}

static_assert(MSM_BLOCK_POINT <= msm::ACCUMULATE_THREADS, "accumulate_sorted's shared staging is too small");

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_accumulate_sorted(g1_xyzz_t* buckets, uint32_t* head_keys, g1_xyzz_t* head_pts, const uint32_t* sorted,
                          const uint32_t* offsets, const g1_affine_t* bases, uint32_t K, uint32_t S) {
    msm::accumulate_sorted(buckets, head_keys, head_pts, sorted, offsets, bases, K, S);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_accumulate_heads(g1_xyzz_t* buckets, uint32_t* out_keys, g1_xyzz_t* out_pts, const uint32_t* in_keys,
                         const g1_xyzz_t* in_pts, uint32_t count, uint32_t T) {
    msm::accumulate_heads(buckets, out_keys, out_pts, in_keys, in_pts, count, T);
}

// (c') batch-affine rounds; (c) then sums the last round's points with
// msm_accumulate_points.
extern "C" __global__ void __launch_bounds__(MSM_BLOCK_LIGHT)
    msm_halve_counts(uint32_t* counts, const uint32_t* in_off, uint32_t K) {
    msm::halve_counts(counts, in_off, K);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_pair_entries(g1_affine_t* out, fp_t* prefix, const uint32_t* in_off, const uint32_t* out_off,
                     const uint32_t* sorted, const g1_affine_t* bases, uint32_t K, uint32_t S) {
    msm::pair_round(out, prefix, in_off, out_off, msm::EntryPoints<fp_t>{sorted, bases}, K, S);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_pair_points(g1_affine_t* out, fp_t* prefix, const uint32_t* in_off, const uint32_t* out_off,
                    const g1_affine_t* pts, uint32_t K, uint32_t S) {
    msm::pair_round(out, prefix, in_off, out_off, msm::ListPoints<fp_t>{pts}, K, S);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_accumulate_points(g1_xyzz_t* buckets, uint32_t* head_keys, g1_xyzz_t* head_pts, const uint32_t* offsets,
                          const g1_affine_t* pts, uint32_t K, uint32_t S) {
    msm::accumulate_sorted<fp_t, msm::ACCUMULATE_THREADS, true>(buckets, head_keys, head_pts, nullptr, offsets, pts,
                                                               K, S);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_reduce_buckets(g1_xyzz_t* out, const g1_xyzz_t* buckets, const uint32_t* offsets, uint32_t c,
                       uint32_t w_count, uint32_t L) {
    msm::reduce_buckets(out, buckets, offsets, c, w_count, L);
}

// grid.y = group.
extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_sum_chunks(g1_xyzz_t* out, const g1_xyzz_t* in, uint32_t len, uint32_t chunk) {
    msm::sum_chunks(out, in, len, chunk);
}

extern "C" __global__ void __launch_bounds__(MSM_BLOCK_POINT)
    msm_batch_add_bitmap(g1_xyzz_t* out, const g1_affine_t* bases, const uint32_t* bitmap, uint32_t n,
                         uint32_t words) {
    msm::batch_add_bitmap(out, bases, bitmap, n, words);
}
