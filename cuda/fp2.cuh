// Fq2 = Fq[u]/(u^2 + 1), the base field of BLS12-381 G2 (-1 is a non-residue because
// p = 3 mod 4).
//
// Representation: c0 + c1·u, `c0` then `c1`, each an fp_t (arkworks' Montgomery limbs):
// 96 bytes, byte-for-byte arkworks' `Fq2` (`QuadExtField { c0, c1 }`), the layout
// `DevFq2` in layout.rs packs. Every value is reduced coordinate-wise (each < p).
//
// `fp2_t` offers the members curve.cuh and msm.cuh call on their field parameter F
// (zero, one, is_zero, ==, +, -, unary -, dbl, *, sqr, inverse, +=, -=, *=), so the
// point templates instantiate over it unchanged: G2 is y^2 = x^3 + 4(u + 1), a = 0,
// and the a = 0 formulas never use b.
//
// The two products (operator*, sqr) are out of line by default. Inlined at every call
// site (about 45 Fq products in batch_add_bitmap's one mixed addition with its doubling
// branch, more in sum_chunks' full addition), g2.cu's sm_90 cubin was 2.3 MB (0.28 MB
// out of line), far past the SMs' instruction caches; ptxas spilled 224 bytes at 255
// registers in batch_add_bitmap, and nvcc took about 3 minutes per architecture. Out of
// line (sm_90, nvcc 13.0): 182 registers, no spills, seconds to compile; the operands
// pass by reference through a 1 KB stack frame (local memory, cached in L1). Which
// runs faster on an H200 is not measured yet: define TWOLOCK_FP2_INLINE before
// including this header to time the inlined form.
#pragma once

#include "bls12_381.cuh"

#ifdef TWOLOCK_FP2_INLINE
#define TWOLOCK_FP2_PRODUCT __forceinline__
#else
#define TWOLOCK_FP2_PRODUCT __noinline__
#endif

struct __align__(16) fp2_t {
    fp_t c0, c1;

    __device__ __forceinline__ static fp2_t zero() {
        fp2_t r;
        r.c0 = fp_t::zero();
        r.c1 = fp_t::zero();
        return r;
    }
    __device__ __forceinline__ static fp2_t one() {
        fp2_t r;
        r.c0 = fp_t::one();
        r.c1 = fp_t::zero();
        return r;
    }

    __device__ __forceinline__ bool is_zero() const { return c0.is_zero() & c1.is_zero(); }
    __device__ __forceinline__ bool is_one() const { return c0.is_one() & c1.is_zero(); }

    __device__ __forceinline__ friend bool operator==(const fp2_t& a, const fp2_t& b) {
        return (a.c0 == b.c0) & (a.c1 == b.c1);
    }
    __device__ __forceinline__ friend bool operator!=(const fp2_t& a, const fp2_t& b) { return !(a == b); }

    __device__ __forceinline__ friend fp2_t operator+(const fp2_t& a, const fp2_t& b) {
        fp2_t r;
        r.c0 = a.c0 + b.c0;
        r.c1 = a.c1 + b.c1;
        return r;
    }
    __device__ __forceinline__ friend fp2_t operator-(const fp2_t& a, const fp2_t& b) {
        fp2_t r;
        r.c0 = a.c0 - b.c0;
        r.c1 = a.c1 - b.c1;
        return r;
    }
    // -0 = 0 coordinate-wise (fp_t's negation maps 0 to 0).
    __device__ __forceinline__ fp2_t operator-() const {
        fp2_t r;
        r.c0 = -c0;
        r.c1 = -c1;
        return r;
    }
    __device__ __forceinline__ fp2_t dbl() const {
        fp2_t r;
        r.c0 = c0.dbl();
        r.c1 = c1.dbl();
        return r;
    }

    // Karatsuba, three Fq products: with v0 = a0·b0, v1 = a1·b1 and u^2 = -1,
    // (a0 + a1·u)(b0 + b1·u) = (v0 - v1) + ((a0 + a1)(b0 + b1) - v0 - v1)·u.
    __device__ TWOLOCK_FP2_PRODUCT friend fp2_t operator*(const fp2_t& a, const fp2_t& b) {
        const fp_t v0 = a.c0 * b.c0;
        const fp_t v1 = a.c1 * b.c1;
        const fp_t s = (a.c0 + a.c1) * (b.c0 + b.c1);
        fp2_t r;
        r.c0 = v0 - v1;
        r.c1 = s - v0 - v1;
        return r;
    }

    // Complex squaring, two Fq products: (a0 + a1·u)^2 = (a0 + a1)(a0 - a1) + 2·a0·a1·u.
    __device__ TWOLOCK_FP2_PRODUCT fp2_t sqr() const {
        const fp_t t = c0 * c1;
        fp2_t r;
        r.c0 = (c0 + c1) * (c0 - c1);
        r.c1 = t.dbl();
        return r;
    }

    __device__ __forceinline__ fp2_t& operator+=(const fp2_t& b) { return *this = *this + b; }
    __device__ __forceinline__ fp2_t& operator-=(const fp2_t& b) { return *this = *this - b; }
    __device__ __forceinline__ fp2_t& operator*=(const fp2_t& b) { return *this = *this * b; }

    // (c0 + c1·u)^-1 = (c0 - c1·u) / (c0^2 + c1^2): the norm lies in Fq and is zero only
    // for zero (-1 is a non-residue), which maps to zero as fp_t::inverse does.
    __device__ __forceinline__ fp2_t inverse() const {
        const fp_t t = (c0.sqr() + c1.sqr()).inverse();
        fp2_t r;
        r.c0 = c0 * t;
        r.c1 = -(c1 * t);
        return r;
    }
};

static_assert(sizeof(fp2_t) == 96, "fp2_t must match arkworks Fq2 (96 bytes)");
