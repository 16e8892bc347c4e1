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

#include "safegcd.cuh"

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
template <int N, const uint32_t MOD[N], const uint32_t& M0, const uint32_t ONE[N], const uint32_t RR[N]>
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

    // Montgomery product a·b·R^-1 mod p, one 32-bit limb of b per round, with the
    // running sum T kept in two halves (the even/odd split sppark uses, after Emmart,
    // Zheng and Weems, "Faster modular exponentiation using double precision floating
    // point arithmetic on the GPU", 2018): T = ev + od·2^32, where ev collects the
    // products a_j·b_i of even j and od those of odd j. A product's low and high words
    // then land in adjacent limbs of one half, so each `mad.lo`/`madc.hi` pair on the
    // same operands becomes one wide IMAD in SASS, and no round needs a separate carry
    // propagation. Against the lo-pass/hi-pass CIOS this replaced, ptxas emits about a
    // third of the instructions (Fr: 190 against 583 for sm_90).
    //
    // Bounds: with a, b < p and p < 2^(32N-1), each round's T stays below 2p·2^32 <
    // 2^(32(N+1)), the weight of od's top limb plus one, and both halves are
    // non-negative parts of T, so no chain carries out of its top limb.
    __device__ __forceinline__ friend mont_t operator*(const mont_t& a, const mont_t& b) {
        uint32_t ev[N], od[N];
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            mul_round(ev, od, a.v, b.v[i], i == 0);
            mul_round(od, ev, a.v, b.v[i + 1], false);  // halves swap roles: T shifted a limb
        }
        // After the last round T = od + ev·2^32 with od[0] = 0: T/2^32 = ev + od[1..].
        mont_t r;
        uint32_t t[N];
        t[0] = ptx::add_cc(ev[0], od[1]);
#pragma unroll
        for (int j = 1; j < N - 1; j++) t[j] = ptx::addc_cc(ev[j], od[j + 1]);
        t[N - 1] = ptx::addc(ev[N - 1], 0);
        final_sub(r.v, t);
        return r;
    }

   private:
    // acc[j], acc[j+1] = lo, hi of x[j]·y for even j < len (len even): products of
    // alternate limbs do not overlap.
    __device__ __forceinline__ static void mul_pairs(uint32_t* acc, const uint32_t* x, uint32_t y, int len) {
#pragma unroll
        for (int j = 0; j < len; j += 2)
            asm volatile("mul.lo.u32 %0, %2, %3; mul.hi.u32 %1, %2, %3;"
                         : "=r"(acc[j]), "=r"(acc[j + 1])
                         : "r"(x[j]), "r"(y));
    }
    // acc += Σ_{even j < len} x[j]·y·2^(32j), one carry chain started here; the carry
    // out of acc[len-1] is left in the flag for the caller.
    __device__ __forceinline__ static void mad_pairs(uint32_t* acc, const uint32_t* x, uint32_t y, int len) {
        asm volatile("mad.lo.cc.u32 %0, %2, %3, %0; madc.hi.cc.u32 %1, %2, %3, %1;"
                     : "+r"(acc[0]), "+r"(acc[1])
                     : "r"(x[0]), "r"(y));
#pragma unroll
        for (int j = 2; j < len; j += 2)
            asm volatile("madc.lo.cc.u32 %0, %2, %3, %0; madc.hi.cc.u32 %1, %2, %3, %1;"
                         : "+r"(acc[j]), "+r"(acc[j + 1])
                         : "r"(x[j]), "r"(y));
    }
    // od = od[2..] + Σ_{odd j} a_j·y·2^(32(j-1)), continuing the carry in the flag:
    // the odd half moves down one limb pair as it takes the round's odd products.
    __device__ __forceinline__ static void mad_pairs_shift(uint32_t* od, const uint32_t* a, uint32_t y) {
#pragma unroll
        for (int j = 0; j < N - 2; j += 2)
            asm volatile("madc.lo.cc.u32 %0, %2, %3, %4; madc.hi.cc.u32 %1, %2, %3, %5;"
                         : "=r"(od[j]), "=r"(od[j + 1])
                         : "r"(a[j + 1]), "r"(y), "r"(od[j + 2]), "r"(od[j + 3]));
        asm volatile("madc.lo.cc.u32 %0, %2, %3, 0; madc.hi.u32 %1, %2, %3, 0;"
                     : "=r"(od[N - 2]), "=r"(od[N - 1])
                     : "r"(a[N - 1]), "r"(y));
    }
    // One round on T = ev + od·2^32: T += a·y, then T += m·p with m making ev[0] zero.
    // The caller swaps ev and od for the next round, which divides T by 2^32: the new
    // even half is od, and the old ev[1] (still in ev) is folded into it first.
    __device__ __forceinline__ static void mul_round(uint32_t* ev, uint32_t* od, const uint32_t* a, uint32_t y,
                                                     bool first) {
        if (first) {
            mul_pairs(od, a + 1, y, N);
            mul_pairs(ev, a, y, N);
        } else {
            // ev, od arrive as (new even half, old even half): fold old ev[1] into the
            // new ev[0] and shift the old half down while adding the odd products.
            ev[0] = ptx::add_cc(ev[0], od[1]);
            mad_pairs_shift(od, a, y);
            mad_pairs(ev, a, y, N);
            od[N - 1] = ptx::addc(od[N - 1], 0);
        }
        const uint32_t m = ev[0] * M0;
        mad_pairs(od, MOD + 1, m, N);
        mad_pairs(ev, MOD, m, N);
        od[N - 1] = ptx::addc(od[N - 1], 0);
    }

   public:
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

    // a^-1, 0 for 0. This is a·R in Montgomery form; safegcd inverts the integer, giving
    // a^-1·R^-1, and a Montgomery product with R^3 = (R^2)^2·R^-1 makes it a^-1·R.
    // Integer work only (~38 batches of 30 divsteps for Fq) against Fermat's ~570
    // products; Fermat stays as the fallback for a divstep count past the proven bound
    // (which does not happen).
    __device__ __forceinline__ mont_t inverse() const {
        mont_t r;
        if (safegcd::inverse<N>(r.v, v, MOD)) return r * (r2() * r2());
        return inverse_fermat();
    }
    // a^(p-2) = a^-1 by Fermat's little theorem; 0 maps to 0.
    __device__ __noinline__ mont_t inverse_fermat() const {
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
