// Modular inversion by Bernstein–Yang divsteps ("safegcd"), for the batch-affine MSM
// rounds, where Fermat's a^(p-2) (about 570 Fq products) was a fifth of the work.
//
// Values are signed with 30-bit limbs (int32_t; every limb but the top in [0, 2^30),
// the top one signed) so that products fit int64 accumulators. Each batch runs 30
// divsteps on the low limbs of f and g alone, as a 2x2 transition matrix t (entries
// |.| <= 2^30), then applies t to the whole f, g (dividing by 2^30 exactly) and to
// d, e (dividing by 2^30 modulo M: a multiple of M clears the low 30 bits). The
// invariants f = d·x and g = e·x (mod M) hold throughout; when g reaches 0, f = ±1
// and x^-1 = ±d. The divsteps are branch-free (no warp divergence); the loop stops at
// the first batch boundary with g = 0, within the bound of Bernstein–Yang's Theorem
// 11.2 (floor((49d + 80) / 17) divsteps for d-bit inputs, d >= 46).
//
// Plain C++ (host and device) so that the host tests in src/device/cuda/safegcd.rs
// check it against arkworks without a GPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SAFEGCD_FN __host__ __device__ __forceinline__
#else
#define SAFEGCD_FN inline
#endif

namespace safegcd {

constexpr int32_t M30 = (int32_t)((1u << 30) - 1);

// A value of L 30-bit limbs.
template <int L>
struct S30 {
    int32_t v[L];
};

// The limbs that hold a value of N 32-bit words, with room for the sign and 2·M.
template <int N>
struct Limbs {
    static constexpr int L = 32 * N / 30 + 1;
    // Divsteps that certainly end with g = 0, in batches of 30.
    static constexpr int BATCHES = ((49 * 32 * N + 80) / 17 + 29) / 30;
};

// The 2x2 transition matrix of 30 divsteps: 2^30·(f', g') = (u f + v g, q f + r g).
struct Trans {
    int32_t u, v, q, r;
};

// Little-endian 32-bit words -> 30-bit limbs (a nonnegative value).
template <int N>
SAFEGCD_FN void from_words(S30<Limbs<N>::L>& r, const uint32_t* a) {
    constexpr int L = Limbs<N>::L;
#pragma unroll
    for (int i = 0; i < L; i++) {
        const int bit = 30 * i, w = bit / 32, sh = bit % 32;
        const uint64_t lo = w < N ? a[w] : 0, hi = w + 1 < N ? a[w + 1] : 0;
        r.v[i] = (int32_t)((hi << 32 | lo) >> sh) & M30;
    }
}

// 30-bit limbs (each in [0, 2^30), a value < 2^(32N)) -> little-endian 32-bit words.
template <int N>
SAFEGCD_FN void to_words(uint32_t* r, const S30<Limbs<N>::L>& a) {
    constexpr int L = Limbs<N>::L;
#pragma unroll
    for (int w = 0; w < N; w++) {
        const int bit = 32 * w, i = bit / 30, sh = bit % 30;
        uint64_t x = (uint64_t)(uint32_t)a.v[i] >> sh;
        if (i + 1 < L) x |= (uint64_t)(uint32_t)a.v[i + 1] << (30 - sh);
        if (i + 2 < L) x |= (uint64_t)(uint32_t)a.v[i + 2] << (60 - sh);
        r[w] = (uint32_t)x;
    }
}

// 30 divsteps of (delta, f, g) on their low 32 bits (f odd); returns the new delta.
// A divstep: if delta > 0 and g is odd, (1 - delta, g, (g - f)/2); else if g is odd,
// (1 + delta, f, (g + f)/2); else (1 + delta, f, g/2). The first case is the second
// after swapping (f, g) to (g, -f) and negating delta, done with masks.
SAFEGCD_FN int32_t divsteps_30(int32_t delta, uint32_t f, uint32_t g, Trans& t) {
    uint32_t u = 1, v = 0, q = 0, r = 1;  // wrap-around arithmetic; |entries| <= 2^30
#pragma unroll
    for (int i = 0; i < 30; i++) {
        const uint32_t odd = 0u - (g & 1);
        const uint32_t sw = odd & (uint32_t)((0 - delta) >> 31);  // g odd and delta > 0
        const uint32_t f0 = f, u0 = u, v0 = v;
        f ^= (f ^ g) & sw;
        g ^= (g ^ (0u - f0)) & sw;
        u ^= (u ^ q) & sw;
        q ^= (q ^ (0u - u0)) & sw;
        v ^= (v ^ r) & sw;
        r ^= (r ^ (0u - v0)) & sw;
        delta = (delta ^ (int32_t)sw) - (int32_t)sw;
        g += f & odd;
        q += u & odd;
        r += v & odd;
        g >>= 1;
        u <<= 1;
        v <<= 1;
        delta += 1;
    }
    t.u = (int32_t)u;
    t.v = (int32_t)v;
    t.q = (int32_t)q;
    t.r = (int32_t)r;
    return delta;
}

// (f, g) = t·(f, g) / 2^30, exact.
template <int L>
SAFEGCD_FN void update_fg(S30<L>& f, S30<L>& g, const Trans& t) {
    int64_t cf = (int64_t)t.u * f.v[0] + (int64_t)t.v * g.v[0];
    int64_t cg = (int64_t)t.q * f.v[0] + (int64_t)t.r * g.v[0];
    cf >>= 30;
    cg >>= 30;
#pragma unroll
    for (int i = 1; i < L; i++) {
        cf += (int64_t)t.u * f.v[i] + (int64_t)t.v * g.v[i];
        cg += (int64_t)t.q * f.v[i] + (int64_t)t.r * g.v[i];
        f.v[i - 1] = (int32_t)cf & M30;
        g.v[i - 1] = (int32_t)cg & M30;
        cf >>= 30;
        cg >>= 30;
    }
    f.v[L - 1] = (int32_t)cf;
    g.v[L - 1] = (int32_t)cg;
}

// (d, e) = t·(d, e) / 2^30 mod M, for d, e in (-2M, M), which they stay in: first add
// M·u (and so on) for each negative input, then the multiple of M that zeroes the low
// 30 bits (minv = M^-1 mod 2^30).
template <int L>
SAFEGCD_FN void update_de(S30<L>& d, S30<L>& e, const Trans& t, const S30<L>& M, uint32_t minv) {
    const int32_t sd = d.v[L - 1] >> 31, se = e.v[L - 1] >> 31;
    int32_t md = (t.u & sd) + (t.v & se);
    int32_t me = (t.q & sd) + (t.r & se);
    int64_t cd = (int64_t)t.u * d.v[0] + (int64_t)t.v * e.v[0];
    int64_t ce = (int64_t)t.q * d.v[0] + (int64_t)t.r * e.v[0];
    md -= (int32_t)((minv * (uint32_t)cd + (uint32_t)md) & (uint32_t)M30);
    me -= (int32_t)((minv * (uint32_t)ce + (uint32_t)me) & (uint32_t)M30);
    cd += (int64_t)M.v[0] * md;
    ce += (int64_t)M.v[0] * me;
    cd >>= 30;
    ce >>= 30;
#pragma unroll
    for (int i = 1; i < L; i++) {
        cd += (int64_t)t.u * d.v[i] + (int64_t)t.v * e.v[i] + (int64_t)M.v[i] * md;
        ce += (int64_t)t.q * d.v[i] + (int64_t)t.r * e.v[i] + (int64_t)M.v[i] * me;
        d.v[i - 1] = (int32_t)cd & M30;
        e.v[i - 1] = (int32_t)ce & M30;
        cd >>= 30;
        ce >>= 30;
    }
    d.v[L - 1] = (int32_t)cd;
    e.v[L - 1] = (int32_t)ce;
}

// a = a + k·M for k in {-1, 0, 1}, limbs renormalized (top signed); k = 0 only
// renormalizes.
template <int L>
SAFEGCD_FN void add_multiple(S30<L>& a, const S30<L>& M, int32_t k) {
    int64_t c = 0;
#pragma unroll
    for (int i = 0; i < L - 1; i++) {
        c += (int64_t)a.v[i] + (int64_t)k * M.v[i];
        a.v[i] = (int32_t)c & M30;
        c >>= 30;
    }
    a.v[L - 1] = (int32_t)(c + a.v[L - 1] + (int64_t)k * M.v[L - 1]);
}

// a >= M for a >= 0 with normalized limbs.
template <int L>
SAFEGCD_FN bool at_least(const S30<L>& a, const S30<L>& M) {
    for (int i = L - 1; i >= 0; i--)
        if (a.v[i] != M.v[i]) return a.v[i] > M.v[i];
    return true;
}

template <int L>
SAFEGCD_FN bool is_zero(const S30<L>& a) {
    int32_t x = 0;
#pragma unroll
    for (int i = 0; i < L; i++) x |= a.v[i];
    return x == 0;
}

// out = x^-1 mod m for x < m (words of N 32-bit limbs, m odd, m < 2^(32N - 2)), or 0
// for x = 0. Returns false (out untouched) if the divsteps did not finish within
// their bound, which Theorem 11.2 rules out; callers fall back to Fermat then.
template <int N>
SAFEGCD_FN bool inverse(uint32_t* out, const uint32_t* x, const uint32_t* m) {
    constexpr int L = Limbs<N>::L;
    S30<L> M, f, g, d, e;
    from_words<N>(M, m);
    from_words<N>(g, x);
    f = M;
#pragma unroll
    for (int i = 0; i < L; i++) d.v[i] = e.v[i] = 0;
    e.v[0] = 1;
    // M^-1 mod 2^30 by Newton's iteration: m·m = 1 mod 8 for odd m, and each step
    // doubles the correct bits (3 -> 6 -> 12 -> 24 -> 48).
    uint32_t minv = m[0];
    for (int i = 0; i < 4; i++) minv *= 2 - m[0] * minv;
    minv &= (uint32_t)M30;
    int32_t delta = 1;
    for (int b = 0; b < Limbs<N>::BATCHES && !is_zero(g); b++) {
        Trans t;
        delta = divsteps_30(delta, (uint32_t)f.v[0], (uint32_t)g.v[0], t);
        update_de(d, e, t, M, minv);
        update_fg(f, g, t);
    }
    if (!is_zero(g)) return false;
    // f = ±1 (x invertible) or f = ±M (x = 0, d = 0): x^-1 = sign(f)·d, into [0, M).
    if (f.v[L - 1] < 0) {
#pragma unroll
        for (int i = 0; i < L; i++) d.v[i] = -d.v[i];
        add_multiple(d, M, 0);  // renormalize the limbs
    }
    while (d.v[L - 1] < 0) add_multiple(d, M, 1);
    while (at_least(d, M)) add_multiple(d, M, -1);
    to_words<N>(out, d);
    return true;
}

}  // namespace safegcd
