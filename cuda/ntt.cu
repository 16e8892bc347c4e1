// Fr NTT kernels (see ntt.cuh) and the witness map's pointwise step.
#include "ntt.cuh"

// 128 threads (src/device/cuda/ntt.rs: MAX_BLOCK) at 5 blocks per SM: 96 registers,
// no spill. At 6 per SM (80 registers) ptxas spills and 2^24 is no faster.
extern "C" __global__ void __launch_bounds__(128, 5)
    ntt_dif_pass(fr_t* __restrict__ data, uint32_t log_n, uint32_t done, uint32_t k, uint32_t log_t,
                 const fr_t* __restrict__ small, const fr_t* __restrict__ direct,
                 const fr_t* __restrict__ tw_hi, const fr_t* __restrict__ tw_lo,
                 const fr_t* __restrict__ coset_hi, const fr_t* __restrict__ coset_lo) {
    const ntt::Roots w{small, direct, tw_hi, tw_lo, coset_hi, coset_lo};
    ntt::dif_pass<false>(data, data, log_n, done, k, log_t, w, ntt::OutFactor{});
}

// The same pass out of place (the first pass of a transform with a scratch buffer):
// dst must not overlap src.
extern "C" __global__ void __launch_bounds__(128, 5)
    ntt_dif_pass_copy(const fr_t* __restrict__ src, fr_t* __restrict__ dst, uint32_t log_n, uint32_t done,
                      uint32_t k, uint32_t log_t, const fr_t* __restrict__ small,
                      const fr_t* __restrict__ direct, const fr_t* __restrict__ tw_hi,
                      const fr_t* __restrict__ tw_lo, const fr_t* __restrict__ coset_hi,
                      const fr_t* __restrict__ coset_lo) {
    const ntt::Roots w{small, direct, tw_hi, tw_lo, coset_hi, coset_lo};
    ntt::dif_pass<false>(src, dst, log_n, done, k, log_t, w, ntt::OutFactor{});
}

// The last pass of a transform with the bit reversal and its output factor fused in
// (dst must not overlap src): out[brev(i)] = pass(src)[i] · factor(brev(i)).
extern "C" __global__ void __launch_bounds__(128, 5)
    ntt_dif_pass_brev(const fr_t* __restrict__ src, fr_t* __restrict__ dst, uint32_t log_n, uint32_t done,
                      uint32_t k, uint32_t log_t, const fr_t* __restrict__ small,
                      const fr_t* __restrict__ direct, const fr_t* __restrict__ tw_hi,
                      const fr_t* __restrict__ tw_lo, const fr_t* __restrict__ coset_hi,
                      const fr_t* __restrict__ coset_lo, uint32_t has_scale, fr_t scale,
                      const fr_t* __restrict__ out_hi, const fr_t* __restrict__ out_lo) {
    const ntt::Roots w{small, direct, tw_hi, tw_lo, coset_hi, coset_lo};
    const ntt::OutFactor out{has_scale != 0, scale, out_hi, out_lo};
    ntt::dif_pass<true>(src, dst, log_n, done, k, log_t, w, out);
}

extern "C" __global__ void ntt_bitrev_scale(fr_t* __restrict__ data, uint32_t log_n,
                                            uint32_t has_scale, fr_t scale,
                                            const fr_t* __restrict__ hi,
                                            const fr_t* __restrict__ lo) {
    ntt::bitrev_scale(data, log_n, has_scale != 0, scale, hi, lo);
}

extern "C" __global__ void __launch_bounds__(ntt::BITREV_THREADS)
    ntt_bitrev_tiled(fr_t* __restrict__ data, uint32_t log_n, uint32_t has_scale, fr_t scale,
                     const fr_t* __restrict__ hi, const fr_t* __restrict__ lo) {
    ntt::bitrev_tiled(data, log_n, has_scale != 0, scale, hi, lo);
}

// a[i] = (a[i]·b[i] − c[i]) · z_inv: the QAP quotient on the coset, z_inv = 1/(g^n − 1).
extern "C" __global__ void qap_divide(fr_t* __restrict__ a, const fr_t* __restrict__ b,
                                      const fr_t* __restrict__ c, fr_t z_inv, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] = (a[i] * b[i] - c[i]) * z_inv;
}
