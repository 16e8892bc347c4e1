// Montgomery arithmetic modulo an odd prime of N 32-bit limbs, as one template over
// the curve constants in bls12_381.cuh.
//
// Representation: `v[0]` is the least significant limb; the value is a·R mod p with
// R = 2^(32N), reduced (< p). That is byte-for-byte arkworks' `Fp<P, N/2>`
// (`[u64; N/2]`, little-endian, Montgomery form), so device buffers hold arkworks'
// bytes with no conversion pass.
//
// Every routine requires p < 2^(32N-1) (one bit of headroom: 255 of 256 bits for Fr,
// 381 of 384 for Fq), so a + b never carries out of the top limb and the Montgomery
// accumulator stays below 2p.
//
// Carry chains use PTX `add.cc` / `addc` / `mad*.cc` in consecutive `asm volatile`
// statements (as sppark and icicle do): nothing between them touches the carry flag.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ptx {
#define TWOLOCK_PTX3(name, insn)                                                     \
    __device__ __forceinline__ uint32_t name(uint32_t a, uint32_t b) {               \
        uint32_t r;                                                                  \
        asm volatile(insn " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));                \
        return r;                                                                    \
    }
#define TWOLOCK_PTX4(name, insn)                                                     \
    __device__ __forceinline__ uint32_t name(uint32_t a, uint32_t b, uint32_t c) {   \
        uint32_t r;                                                                  \
        asm volatile(insn " %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));    \
        return r;                                                                    \
    }
TWOLOCK_PTX3(add_cc, "add.cc.u32")
TWOLOCK_PTX3(addc_cc, "addc.cc.u32")
TWOLOCK_PTX3(addc, "addc.u32")
TWOLOCK_PTX3(sub_cc, "sub.cc.u32")
TWOLOCK_PTX3(subc_cc, "subc.cc.u32")
TWOLOCK_PTX3(subc, "subc.u32")
TWOLOCK_PTX4(mad_lo_cc, "mad.lo.cc.u32")
TWOLOCK_PTX4(madc_lo_cc, "madc.lo.cc.u32")
TWOLOCK_PTX4(mad_hi_cc, "mad.hi.cc.u32")
TWOLOCK_PTX4(madc_hi_cc, "madc.hi.cc.u32")
#undef TWOLOCK_PTX3
#undef TWOLOCK_PTX4
}  // namespace ptx

// MOD: the prime p; M0 = -p^-1 mod 2^32; ONE = R mod p (Montgomery one);
// RR = R^2 mod p (to_mont(a) = a * RR).
template <int N, const uint32_t MOD[N], uint32_t M0, const uint32_t ONE[N], const uint32_t RR[N]>
struct __align__(16) mont_t {
    static constexpr int LIMBS = N;
    uint32_t v[N];

    __device__ __forceinline__ static mont_t zero() {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N; i++) r.v[i] = 0;
        return r;
    }
    __device__ __forceinline__ static mont_t one() {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N; i++) r.v[i] = ONE[i];
        return r;
    }
    // R^2 mod p in Montgomery form, i.e. the value R: `a * r2()` turns a plain
    // (non-Montgomery) residue a into Montgomery form.
    __device__ __forceinline__ static mont_t r2() {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N; i++) r.v[i] = RR[i];
        return r;
    }

    __device__ __forceinline__ bool is_zero() const {
        uint32_t acc = 0;
#pragma unroll
        for (int i = 0; i < N; i++) acc |= v[i];
        return acc == 0;
    }
    __device__ __forceinline__ bool is_one() const { return *this == one(); }

    __device__ __forceinline__ friend bool operator==(const mont_t& a, const mont_t& b) {
        uint32_t acc = 0;
#pragma unroll
        for (int i = 0; i < N; i++) acc |= a.v[i] ^ b.v[i];
        return acc == 0;
    }
    __device__ __forceinline__ friend bool operator!=(const mont_t& a, const mont_t& b) {
        return !(a == b);
    }

    // r = t - p if t >= p, else t; requires t < 2p.
    __device__ __forceinline__ static void final_sub(uint32_t r[N], const uint32_t t[N]) {
        uint32_t s[N];
        s[0] = ptx::sub_cc(t[0], MOD[0]);
#pragma unroll
        for (int i = 1; i < N; i++) s[i] = ptx::subc_cc(t[i], MOD[i]);
        uint32_t borrow = ptx::subc(0, 0);  // all ones when t < p
#pragma unroll
        for (int i = 0; i < N; i++) r[i] = borrow ? t[i] : s[i];
    }

    __device__ __forceinline__ friend mont_t operator+(const mont_t& a, const mont_t& b) {
        uint32_t t[N];
        t[0] = ptx::add_cc(a.v[0], b.v[0]);
#pragma unroll
        for (int i = 1; i < N - 1; i++) t[i] = ptx::addc_cc(a.v[i], b.v[i]);
        t[N - 1] = ptx::addc(a.v[N - 1], b.v[N - 1]);  // headroom: no carry out
        mont_t r;
        final_sub(r.v, t);
        return r;
    }

    __device__ __forceinline__ friend mont_t operator-(const mont_t& a, const mont_t& b) {
        uint32_t t[N];
        t[0] = ptx::sub_cc(a.v[0], b.v[0]);
#pragma unroll
        for (int i = 1; i < N; i++) t[i] = ptx::subc_cc(a.v[i], b.v[i]);
        uint32_t mask = ptx::subc(0, 0);  // all ones when a < b
        mont_t r;
        r.v[0] = ptx::add_cc(t[0], MOD[0] & mask);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.v[i] = ptx::addc_cc(t[i], MOD[i] & mask);
        r.v[N - 1] = ptx::addc(t[N - 1], MOD[N - 1] & mask);
        return r;
    }

    // -0 = 0; otherwise p - a.
    __device__ __forceinline__ mont_t operator-() const { return zero() - *this; }
    __device__ __forceinline__ mont_t dbl() const { return *this + *this; }

    // Montgomery product a·b·R^-1 mod p (CIOS, one 32-bit limb of b per round).
    __device__ __forceinline__ friend mont_t operator*(const mont_t& a, const mont_t& b) {
        uint32_t t[N + 2];
#pragma unroll
        for (int j = 0; j < N + 2; j++) t[j] = 0;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint32_t bi = b.v[i];
            // t += a·b_i: low halves at j, high halves at j + 1.
            t[0] = ptx::mad_lo_cc(a.v[0], bi, t[0]);
#pragma unroll
            for (int j = 1; j < N; j++) t[j] = ptx::madc_lo_cc(a.v[j], bi, t[j]);
            t[N] = ptx::addc_cc(t[N], 0);
            t[N + 1] = ptx::addc(t[N + 1], 0);
            t[1] = ptx::mad_hi_cc(a.v[0], bi, t[1]);
#pragma unroll
            for (int j = 1; j < N; j++) t[j + 1] = ptx::madc_hi_cc(a.v[j], bi, t[j + 1]);
            t[N + 1] = ptx::addc(t[N + 1], 0);
            // t += m·p with m chosen so the low limb becomes zero, then shift a limb.
            const uint32_t m = t[0] * M0;
            t[0] = ptx::mad_lo_cc(MOD[0], m, t[0]);
#pragma unroll
            for (int j = 1; j < N; j++) t[j] = ptx::madc_lo_cc(MOD[j], m, t[j]);
            t[N] = ptx::addc_cc(t[N], 0);
            t[N + 1] = ptx::addc(t[N + 1], 0);
            t[1] = ptx::mad_hi_cc(MOD[0], m, t[1]);
#pragma unroll
            for (int j = 1; j < N; j++) t[j + 1] = ptx::madc_hi_cc(MOD[j], m, t[j + 1]);
            t[N + 1] = ptx::addc(t[N + 1], 0);
#pragma unroll
            for (int j = 0; j < N + 1; j++) t[j] = t[j + 1];
            t[N + 1] = 0;
        }
        // t < 2p < 2^(32N), so t[N] == 0 here.
        mont_t r;
        final_sub(r.v, t);
        return r;
    }

    __device__ __forceinline__ mont_t sqr() const { return *this * *this; }

    __device__ __forceinline__ mont_t& operator+=(const mont_t& b) { return *this = *this + b; }
    __device__ __forceinline__ mont_t& operator-=(const mont_t& b) { return *this = *this - b; }
    __device__ __forceinline__ mont_t& operator*=(const mont_t& b) { return *this = *this * b; }

    // a^e for an exponent of `words` 32-bit limbs (little-endian), square-and-multiply.
    __device__ __noinline__ mont_t pow_limbs(const uint32_t* e, int words) const {
        mont_t r = one();
        for (int w = words - 1; w >= 0; w--) {
            for (int bit = 31; bit >= 0; bit--) {
                r = r.sqr();
                if ((e[w] >> bit) & 1) r = r * *this;
            }
        }
        return r;
    }
    __device__ __forceinline__ mont_t pow(uint64_t e) const {
        uint32_t limbs[2] = {(uint32_t)e, (uint32_t)(e >> 32)};
        return pow_limbs(limbs, 2);
    }

    // a^(p-2) = a^-1 by Fermat's little theorem; 0 maps to 0.
    __device__ __forceinline__ mont_t inverse() const {
        uint32_t e[N];
        e[0] = ptx::sub_cc(MOD[0], 2);
#pragma unroll
        for (int i = 1; i < N; i++) e[i] = ptx::subc_cc(MOD[i], 0);
        (void)ptx::subc(0, 0);
        return pow_limbs(e, N);
    }
};

// Montgomery's trick over one thread's run: out[i] = in[i]^-1, zeros map to zero.
// One inversion and 3(n-1) multiplications. `out` must not alias `in`.
template <class F>
__device__ void batch_inverse(F* out, const F* in, size_t n) {
    F acc = F::one();
    for (size_t i = 0; i < n; i++) {
        out[i] = acc;
        if (!in[i].is_zero()) acc *= in[i];
    }
    F inv = acc.inverse();
    for (size_t i = n; i-- > 0;) {
        if (in[i].is_zero()) {
            out[i] = F::zero();
        } else {
            F t = out[i] * inv;
            inv *= in[i];
            out[i] = t;
        }
    }
}
