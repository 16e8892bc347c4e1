// Elementwise test kernels for the field and curve arithmetic, and the Fr-mul rate
// kernel the NTT benchmark uses as a floor. Each thread handles one index i < n.
#include "curve.cuh"
#include "fp2.cuh"

#define ELEMENTWISE(name, T_OUT, T_A, T_B, body)                                          \
    extern "C" __global__ void name(T_OUT* __restrict__ out, const T_A* __restrict__ a,  \
                                    const T_B* __restrict__ b, size_t n) {               \
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                        \
        if (i >= n) return;                                                              \
        (void)b;                                                                         \
        body;                                                                            \
    }

#define FIELD_KERNELS(F, pre)                                                            \
    ELEMENTWISE(pre##_add, F, F, F, out[i] = a[i] + b[i])                                 \
    ELEMENTWISE(pre##_sub, F, F, F, out[i] = a[i] - b[i])                                 \
    ELEMENTWISE(pre##_neg, F, F, F, out[i] = -a[i])                                       \
    ELEMENTWISE(pre##_dbl, F, F, F, out[i] = a[i].dbl())                                  \
    ELEMENTWISE(pre##_mul, F, F, F, out[i] = a[i] * b[i])                                 \
    ELEMENTWISE(pre##_sqr, F, F, F, out[i] = a[i].sqr())                                  \
    ELEMENTWISE(pre##_inverse, F, F, F, out[i] = a[i].inverse())                          \
    ELEMENTWISE(pre##_eq, F, F, F, out[i] = (a[i] == b[i]) ? F::one() : F::zero())        \
    ELEMENTWISE(pre##_is_zero, F, F, F, out[i] = a[i].is_zero() ? F::one() : F::zero())

FIELD_KERNELS(fr_t, fr)
FIELD_KERNELS(fp_t, fp)
FIELD_KERNELS(fp2_t, fp2)

// Batch inverse over runs of `chunk` elements, one run per thread.
extern "C" __global__ void fr_batch_inverse(fr_t* __restrict__ out, const fr_t* __restrict__ a,
                                            size_t n, size_t chunk) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t start = t * chunk;
    if (start >= n) return;
    size_t len = n - start < chunk ? n - start : chunk;
    batch_inverse(out + start, a + start, len);
}

ELEMENTWISE(g1_add, g1_xyzz_t, g1_xyzz_t, g1_xyzz_t, { g1_xyzz_t p = a[i]; xyzz_add(p, b[i]); out[i] = p; })
ELEMENTWISE(g1_add_affine, g1_xyzz_t, g1_xyzz_t, g1_affine_t, { g1_xyzz_t p = a[i]; xyzz_add_affine(p, b[i]); out[i] = p; })
ELEMENTWISE(g1_sub_affine, g1_xyzz_t, g1_xyzz_t, g1_affine_t, { g1_xyzz_t p = a[i]; xyzz_sub_affine(p, b[i]); out[i] = p; })
ELEMENTWISE(g1_dbl, g1_xyzz_t, g1_xyzz_t, g1_xyzz_t, { g1_xyzz_t p = a[i]; xyzz_dbl(p); out[i] = p; })
ELEMENTWISE(g1_dbl_affine, g1_xyzz_t, g1_affine_t, g1_affine_t, { g1_xyzz_t p; xyzz_dbl_affine(p, a[i]); out[i] = p; })
ELEMENTWISE(g1_neg, g1_xyzz_t, g1_xyzz_t, g1_xyzz_t, { g1_xyzz_t p = a[i]; xyzz_neg(p); out[i] = p; })
ELEMENTWISE(g1_affine_neg, g1_affine_t, g1_affine_t, g1_affine_t, { g1_affine_t p = a[i]; affine_neg(p); out[i] = p; })
ELEMENTWISE(g1_affine_to_xyzz, g1_xyzz_t, g1_affine_t, g1_affine_t, out[i] = xyzz_from_affine(a[i]))
ELEMENTWISE(g1_xyzz_to_affine, g1_affine_t, g1_xyzz_t, g1_xyzz_t, out[i] = xyzz_to_affine(a[i]))

// Throughput floor: each thread runs `iters` dependent-pair Fr multiplications on its
// own element (two independent chains to expose ILP) and writes the result, so the
// work cannot be optimized away. Rate = n * iters * 2 / time.
extern "C" __global__ void fr_mul_rate(fr_t* __restrict__ data, size_t n, uint32_t iters) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    fr_t x = data[i], y = x + fr_t::one();
    const fr_t c = x.dbl();
    for (uint32_t k = 0; k < iters; k++) {
        x = x * c;
        y = y * c;
    }
    data[i] = x + y;
}
