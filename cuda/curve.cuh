// Short Weierstrass points with a = 0 (BLS12-381 G1: y^2 = x^3 + 4), templated on the
// base field.
//
// - affine_t: (x, y); the point at infinity is (0, 0), which is not on the curve
//   (0 != 0 + 4). 96 bytes for G1, the device layout `layout.rs` packs.
// - xyzz_t: extended Jacobian (X, Y, ZZ, ZZZ) with x = X/ZZ, y = Y/ZZZ, ZZ^3 = ZZZ^2;
//   infinity is ZZ = 0 (xyzz_inf() also zeroes X, Y, ZZZ). Formulas are the EFD's
//   "xyzz" set for a = 0 (add-2008-s, madd-2008-s, dbl-2008-s-1, mdbl-2008-s-1), with
//   every exceptional case handled explicitly: infinity on either side, P == Q
//   (doubling), P == -Q (infinity).
#pragma once

#include "bls12_381.cuh"

template <class F>
struct affine_t {
    F x, y;
};

template <class F>
struct xyzz_t {
    F X, Y, ZZ, ZZZ;
};

typedef affine_t<fp_t> g1_affine_t;
typedef xyzz_t<fp_t> g1_xyzz_t;

static_assert(sizeof(g1_affine_t) == 96, "g1_affine_t must be 96 bytes");
static_assert(sizeof(g1_xyzz_t) == 192, "g1_xyzz_t must be 192 bytes");

template <class F = fp_t>
__device__ __forceinline__ affine_t<F> affine_inf() {
    affine_t<F> r;
    r.x = F::zero();
    r.y = F::zero();
    return r;
}

template <class F = fp_t>
__device__ __forceinline__ xyzz_t<F> xyzz_inf() {
    xyzz_t<F> r;
    r.X = F::zero();
    r.Y = F::zero();
    r.ZZ = F::zero();
    r.ZZZ = F::zero();
    return r;
}

template <class F>
__device__ __forceinline__ bool is_inf(const affine_t<F>& p) {
    return p.x.is_zero() & p.y.is_zero();
}

template <class F>
__device__ __forceinline__ bool is_inf(const xyzz_t<F>& p) {
    return p.ZZ.is_zero();
}

template <class F>
__device__ __forceinline__ void affine_neg(affine_t<F>& p) {
    p.y = -p.y;  // -0 = 0 keeps infinity at (0, 0)
}

template <class F>
__device__ __forceinline__ void xyzz_neg(xyzz_t<F>& p) {
    p.Y = -p.Y;
}

template <class F>
__device__ __forceinline__ xyzz_t<F> xyzz_from_affine(const affine_t<F>& a) {
    if (is_inf(a)) return xyzz_inf<F>();
    xyzz_t<F> r;
    r.X = a.x;
    r.Y = a.y;
    r.ZZ = F::one();
    r.ZZZ = F::one();
    return r;
}

// Two inversions; for tests and final results, not for hot loops.
template <class F>
__device__ __forceinline__ affine_t<F> xyzz_to_affine(const xyzz_t<F>& p) {
    if (is_inf(p)) return affine_inf<F>();
    affine_t<F> r;
    r.x = p.X * p.ZZ.inverse();
    r.y = p.Y * p.ZZZ.inverse();
    return r;
}

// p = 2p (dbl-2008-s-1, a = 0). Infinity stays infinity (ZZ' = V·ZZ = 0); a point
// with y = 0 would map to infinity too (V = 0), though G1 has none.
template <class F>
__device__ __forceinline__ void xyzz_dbl(xyzz_t<F>& p) {
    F U = p.Y.dbl();
    F V = U.sqr();
    F W = U * V;
    F S = p.X * V;
    F M = p.X.sqr();
    M = M + M.dbl();
    F X3 = M.sqr() - S.dbl();
    p.Y = M * (S - X3) - W * p.Y;
    p.X = X3;
    p.ZZ = p.ZZ * V;
    p.ZZZ = p.ZZZ * W;
}

// p = 2q for affine q (mdbl-2008-s-1, a = 0); infinity maps to infinity.
template <class F>
__device__ __forceinline__ void xyzz_dbl_affine(xyzz_t<F>& p, const affine_t<F>& q) {
    if (is_inf(q)) {
        p = xyzz_inf<F>();
        return;
    }
    F U = q.y.dbl();
    F V = U.sqr();
    F W = U * V;
    F S = q.x * V;
    F M = q.x.sqr();
    M = M + M.dbl();
    p.X = M.sqr() - S.dbl();
    p.Y = M * (S - p.X) - W * q.y;
    p.ZZ = V;
    p.ZZZ = W;
}

// p = p + q (add-2008-s), complete: handles infinity, p == q and p == -q.
template <class F>
__device__ __forceinline__ void xyzz_add(xyzz_t<F>& p, const xyzz_t<F>& q) {
    if (is_inf(q)) return;
    if (is_inf(p)) {
        p = q;
        return;
    }
    F U1 = p.X * q.ZZ;
    F S1 = p.Y * q.ZZZ;
    F P = q.X * p.ZZ - U1;
    F R = q.Y * p.ZZZ - S1;
    if (P.is_zero()) {
        if (R.is_zero())
            xyzz_dbl(p);  // p == q
        else
            p = xyzz_inf<F>();  // p == -q
        return;
    }
    F PP = P.sqr();
    F PPP = P * PP;
    F Q = U1 * PP;
    F X3 = R.sqr() - PPP - Q.dbl();
    p.Y = R * (Q - X3) - S1 * PPP;
    p.X = X3;
    p.ZZ = p.ZZ * q.ZZ * PP;
    p.ZZZ = p.ZZZ * q.ZZZ * PPP;
}

// p = p + q for affine q (madd-2008-s), complete: handles infinity, p == q, p == -q.
template <class F>
__device__ __forceinline__ void xyzz_add_affine(xyzz_t<F>& p, const affine_t<F>& q) {
    if (is_inf(q)) return;
    if (is_inf(p)) {
        p = xyzz_from_affine(q);
        return;
    }
    F P = q.x * p.ZZ - p.X;
    F R = q.y * p.ZZZ - p.Y;
    if (P.is_zero()) {
        if (R.is_zero())
            xyzz_dbl_affine(p, q);  // p == q
        else
            p = xyzz_inf<F>();  // p == -q
        return;
    }
    F PP = P.sqr();
    F PPP = P * PP;
    F Q = p.X * PP;
    F X3 = R.sqr() - PPP - Q.dbl();
    p.Y = R * (Q - X3) - p.Y * PPP;
    p.X = X3;
    p.ZZ = p.ZZ * PP;
    p.ZZZ = p.ZZZ * PPP;
}

// p = p - q for affine q.
template <class F>
__device__ __forceinline__ void xyzz_sub_affine(xyzz_t<F>& p, affine_t<F> q) {
    affine_neg(q);
    xyzz_add_affine(p, q);
}
