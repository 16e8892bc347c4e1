//! Host-side layouts of the values the kernels read and write.
//!
//! Field elements travel as arkworks' own Montgomery limbs (`fr.0 .0`): the device
//! `fr_t` / `fp_t` (cuda/bls12_381.cuh) are exactly those bytes, so no conversion pass
//! runs on either side. `&[Fr]` casts to `&[DevFr]` in place (see [`fr_as_dev`]).
//!
//! Points are packed: `G1Affine` → [`DevG1Affine`] (x, y; 96 bytes, infinity as
//! (0, 0), which is not on y² = x³ + 4). Device XYZZ points ([`DevG1Xyzz`], x = X/ZZ,
//! y = Y/ZZZ, infinity ZZ = 0) come back as Jacobian `G1Projective` with no inversion.
//!
//! G2 has the same shapes over `Fq2` = c0 + c1·u ([`DevFq2`], c0 then c1, the device
//! `fp2_t` of cuda/fp2.cuh): [`DevG2Affine`] (192 bytes, infinity as all zero) and
//! [`DevG2Xyzz`] (384 bytes) ↔ `G2Affine` / Jacobian `G2Projective`. arkworks' `Fq2` is
//! not `repr(C)`, so G2 values are copied coordinate by coordinate, never cast.

use ark_bls12_381::{Fq, Fq2, G1Affine, G1Projective, G2Affine, G2Projective};
use ark_ec::AffineRepr;
use ark_ff::{BigInt, Field, PrimeField, Zero};
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

use crate::Fr;

/// An `Fr` as the device sees it: 4 little-endian u64 limbs, Montgomery form (R = 2^256).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevFr(pub [u64; 4]);

/// An `Fq` as the device sees it: 6 little-endian u64 limbs, Montgomery form (R = 2^384).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevFq(pub [u64; 6]);

/// A G1 affine point as the device sees it (`g1_affine_t`); infinity is (0, 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevG1Affine {
    pub x: DevFq,
    pub y: DevFq,
}

/// A G1 XYZZ point as the device sees it (`g1_xyzz_t`); infinity is ZZ = 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevG1Xyzz {
    pub x: DevFq,
    pub y: DevFq,
    pub zz: DevFq,
    pub zzz: DevFq,
}

/// An `Fq2` = c0 + c1·u as the device sees it (`fp2_t`): c0 then c1, each a [`DevFq`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevFq2 {
    pub c0: DevFq,
    pub c1: DevFq,
}

/// A G2 affine point as the device sees it (`g2_affine_t` of cuda/g2.cu); infinity is
/// all zero, which is not on y² = x³ + 4(u + 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevG2Affine {
    pub x: DevFq2,
    pub y: DevFq2,
}

/// A G2 XYZZ point as the device sees it (`g2_xyzz_t`); infinity is ZZ = 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevG2Xyzz {
    pub x: DevFq2,
    pub y: DevFq2,
    pub zz: DevFq2,
    pub zzz: DevFq2,
}

// SAFETY: plain `#[repr(C)]`/transparent arrays of u64 with no padding; every bit
// pattern is a valid value of the Rust type (validity as a field element is checked
// separately where it matters), and all-zero bits are the zero element / infinity.
unsafe impl DeviceRepr for DevFr {}
unsafe impl ValidAsZeroBits for DevFr {}
unsafe impl DeviceRepr for DevFq {}
unsafe impl ValidAsZeroBits for DevFq {}
unsafe impl DeviceRepr for DevG1Affine {}
unsafe impl ValidAsZeroBits for DevG1Affine {}
unsafe impl DeviceRepr for DevG1Xyzz {}
unsafe impl ValidAsZeroBits for DevG1Xyzz {}
unsafe impl DeviceRepr for DevFq2 {}
unsafe impl ValidAsZeroBits for DevFq2 {}
unsafe impl DeviceRepr for DevG2Affine {}
unsafe impl ValidAsZeroBits for DevG2Affine {}
unsafe impl DeviceRepr for DevG2Xyzz {}
unsafe impl ValidAsZeroBits for DevG2Xyzz {}

// The in-place casts below rely on these. `Fr` is `Fp(BigInt<4>, PhantomData)` and
// `BigInt<4>` is `([u64; 4])`: a struct whose only sized field fills all of its bytes
// has that field at offset 0, so equal size and alignment make the layouts identical.
const _: () = assert!(std::mem::size_of::<Fr>() == 32);
const _: () = assert!(std::mem::align_of::<Fr>() == std::mem::align_of::<DevFr>());
const _: () = assert!(std::mem::size_of::<BigInt<4>>() == 32);
const _: () = assert!(std::mem::size_of::<DevFr>() == 32);
const _: () = assert!(std::mem::size_of::<DevFq>() == 48);
const _: () = assert!(std::mem::size_of::<DevG1Affine>() == 96);
const _: () = assert!(std::mem::size_of::<DevG1Xyzz>() == 192);
// The sizes of fp2_t, g2_affine_t and g2_xyzz_t (static_asserts in cuda/fp2.cuh, g2.cu).
const _: () = assert!(std::mem::size_of::<DevFq2>() == 96);
const _: () = assert!(std::mem::size_of::<DevG2Affine>() == 192);
const _: () = assert!(std::mem::size_of::<DevG2Xyzz>() == 384);

/// Views arkworks scalars as device scalars, without copying.
pub fn fr_as_dev(s: &[Fr]) -> &[DevFr] {
    // SAFETY: identical size and alignment, and `Fr`'s bytes are its limbs (see the
    // asserts above); every `Fr` is a valid `DevFr`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<DevFr>(), s.len()) }
}

/// Mutable view of arkworks scalars as device scalars (download target).
///
/// Writing a non-canonical value (≥ r) through it yields an `Fr` that compares wrong
/// but is memory-safe; [`frs_are_canonical`] checks downloaded data.
pub fn fr_as_dev_mut(s: &mut [Fr]) -> &mut [DevFr] {
    // SAFETY: as in `fr_as_dev`; any bit pattern is memory-safe for `Fr`.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<DevFr>(), s.len()) }
}

pub fn fr_to_dev(f: &Fr) -> DevFr {
    DevFr(f.0 .0)
}

/// The scalar with these Montgomery limbs, or `None` if they are not reduced (≥ r).
pub fn fr_from_dev(d: &DevFr) -> Option<Fr> {
    let b = BigInt(d.0);
    (b < Fr::MODULUS).then(|| Fr::new_unchecked(b))
}

/// Whether every value is a reduced Montgomery representation (< r).
pub fn frs_are_canonical(s: &[DevFr]) -> bool {
    s.iter().all(|d| BigInt(d.0) < Fr::MODULUS)
}

pub fn fq_to_dev(f: &Fq) -> DevFq {
    DevFq(f.0 .0)
}

/// The base-field element with these Montgomery limbs, or `None` if ≥ p.
pub fn fq_from_dev(d: &DevFq) -> Option<Fq> {
    let b = BigInt(d.0);
    (b < Fq::MODULUS).then(|| Fq::new_unchecked(b))
}

/// Packs an affine point; infinity becomes (0, 0).
pub fn g1_affine_to_dev(p: &G1Affine) -> DevG1Affine {
    if p.is_zero() {
        DevG1Affine::default()
    } else {
        DevG1Affine {
            x: fq_to_dev(&p.x),
            y: fq_to_dev(&p.y),
        }
    }
}

/// Packs many affine points (in parallel for large keys).
pub fn g1_affines_to_dev(points: &[G1Affine]) -> Vec<DevG1Affine> {
    use rayon::prelude::*;
    points.par_iter().map(g1_affine_to_dev).collect()
}

/// Unpacks an affine point: (0, 0) is infinity; otherwise the coordinates must be
/// reduced and the point on the curve, or `None`.
pub fn g1_affine_from_dev(d: &DevG1Affine) -> Option<G1Affine> {
    let (x, y) = (fq_from_dev(&d.x)?, fq_from_dev(&d.y)?);
    if x.is_zero() && y.is_zero() {
        return Some(G1Affine::identity());
    }
    let p = G1Affine::new_unchecked(x, y);
    p.is_on_curve().then_some(p)
}

/// Device XYZZ → Jacobian with no inversion: Z = ZZ·ZZZ, X = X·ZZ·ZZZ², Y = Y·ZZ³·ZZZ²,
/// so X/Z² = X/ZZ and Y/Z³ = Y/ZZZ. ZZ = 0 is infinity. `None` if a coordinate is
/// not reduced. (No curve check: use `into_affine().is_on_curve()` where needed.)
pub fn xyzz_to_projective(d: &DevG1Xyzz) -> Option<G1Projective> {
    let (x, y) = (fq_from_dev(&d.x)?, fq_from_dev(&d.y)?);
    let (zz, zzz) = (fq_from_dev(&d.zz)?, fq_from_dev(&d.zzz)?);
    if zz.is_zero() {
        return Some(G1Projective::zero());
    }
    let zzz2 = zzz.square();
    let z = zz * zzz;
    let xj = x * zz * zzz2;
    let yj = y * zz.square() * zz * zzz2;
    Some(G1Projective::new_unchecked(xj, yj, z))
}

/// Jacobian → device XYZZ: ZZ = Z², ZZZ = Z³ (infinity: all zero).
pub fn projective_to_xyzz(p: &G1Projective) -> DevG1Xyzz {
    if p.is_zero() {
        return DevG1Xyzz::default();
    }
    let zz = p.z.square();
    let zzz = zz * p.z;
    DevG1Xyzz {
        x: fq_to_dev(&p.x),
        y: fq_to_dev(&p.y),
        zz: fq_to_dev(&zz),
        zzz: fq_to_dev(&zzz),
    }
}

pub fn fq2_to_dev(f: &Fq2) -> DevFq2 {
    DevFq2 {
        c0: fq_to_dev(&f.c0),
        c1: fq_to_dev(&f.c1),
    }
}

/// The `Fq2` element with these limbs, or `None` if either coordinate is ≥ p.
pub fn fq2_from_dev(d: &DevFq2) -> Option<Fq2> {
    Some(Fq2::new(fq_from_dev(&d.c0)?, fq_from_dev(&d.c1)?))
}

/// Packs a G2 affine point; infinity becomes all zero.
pub fn g2_affine_to_dev(p: &G2Affine) -> DevG2Affine {
    if p.is_zero() {
        DevG2Affine::default()
    } else {
        DevG2Affine {
            x: fq2_to_dev(&p.x),
            y: fq2_to_dev(&p.y),
        }
    }
}

/// Packs many G2 affine points (in parallel for large keys).
pub fn g2_affines_to_dev(points: &[G2Affine]) -> Vec<DevG2Affine> {
    use rayon::prelude::*;
    points.par_iter().map(g2_affine_to_dev).collect()
}

/// Unpacks a G2 affine point: all zero is infinity; otherwise the coordinates must be
/// reduced and the point on the curve, or `None`. (No subgroup check.)
pub fn g2_affine_from_dev(d: &DevG2Affine) -> Option<G2Affine> {
    let (x, y) = (fq2_from_dev(&d.x)?, fq2_from_dev(&d.y)?);
    if x.is_zero() && y.is_zero() {
        return Some(G2Affine::identity());
    }
    let p = G2Affine::new_unchecked(x, y);
    p.is_on_curve().then_some(p)
}

/// Device G2 XYZZ → Jacobian with no inversion, as [`xyzz_to_projective`] does for G1:
/// Z = ZZ·ZZZ, X = X·ZZ·ZZZ², Y = Y·ZZ³·ZZZ². ZZ = 0 is infinity. `None` if a
/// coordinate is not reduced. (No curve check.)
pub fn g2_xyzz_to_projective(d: &DevG2Xyzz) -> Option<G2Projective> {
    let (x, y) = (fq2_from_dev(&d.x)?, fq2_from_dev(&d.y)?);
    let (zz, zzz) = (fq2_from_dev(&d.zz)?, fq2_from_dev(&d.zzz)?);
    if zz.is_zero() {
        return Some(G2Projective::zero());
    }
    let zzz2 = zzz.square();
    let z = zz * zzz;
    let xj = x * zz * zzz2;
    let yj = y * zz.square() * zz * zzz2;
    Some(G2Projective::new_unchecked(xj, yj, z))
}

/// G2 Jacobian → device XYZZ: ZZ = Z², ZZZ = Z³ (infinity: all zero).
pub fn g2_projective_to_xyzz(p: &G2Projective) -> DevG2Xyzz {
    if p.is_zero() {
        return DevG2Xyzz::default();
    }
    let zz = p.z.square();
    let zzz = zz * p.z;
    DevG2Xyzz {
        x: fq2_to_dev(&p.x),
        y: fq2_to_dev(&p.y),
        zz: fq2_to_dev(&zz),
        zzz: fq2_to_dev(&zzz),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ec::CurveGroup;
    use ark_ff::{One, UniformRand};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn layout_fr_cast_is_montgomery_limbs() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let v: Vec<Fr> = (0..64)
            .map(|_| Fr::rand(&mut rng))
            .chain([Fr::zero(), Fr::one(), -Fr::one()])
            .collect();
        let d = fr_as_dev(&v);
        for (f, d) in v.iter().zip(d) {
            assert_eq!(d.0, f.0 .0);
            assert_eq!(fr_from_dev(d), Some(*f));
        }
        // Montgomery one is R mod r, not 1.
        assert_eq!(fr_to_dev(&Fr::one()).0[0], 0x00000001fffffffe);
        let mut back = vec![Fr::zero(); v.len()];
        fr_as_dev_mut(&mut back).copy_from_slice(d);
        assert_eq!(back, v);
        assert!(frs_are_canonical(d));
    }

    #[test]
    fn layout_rejects_unreduced() {
        let r = Fr::MODULUS;
        assert_eq!(fr_from_dev(&DevFr(r.0)), None);
        assert!(!frs_are_canonical(&[DevFr([u64::MAX; 4])]));
        assert_eq!(fq_from_dev(&DevFq(Fq::MODULUS.0)), None);
        let mut below = Fr::MODULUS;
        below.0[0] -= 1;
        assert_eq!(fr_from_dev(&DevFr(below.0)), Some(Fr::new_unchecked(below)));
    }

    #[test]
    fn layout_g1_roundtrip() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let mut pts: Vec<G1Affine> = (0..32)
            .map(|_| G1Projective::rand(&mut rng).into_affine())
            .collect();
        pts.push(G1Affine::identity());
        pts.push(G1Affine::generator());
        let dev = g1_affines_to_dev(&pts);
        assert_eq!(dev[32], DevG1Affine::default());
        for (p, d) in pts.iter().zip(&dev) {
            assert_eq!(g1_affine_from_dev(d), Some(*p));
        }
        // Off-curve data is refused.
        let mut bad = dev[0];
        bad.y = bad.x;
        assert_eq!(g1_affine_from_dev(&bad), None);
    }

    #[test]
    fn layout_xyzz_roundtrip() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        for _ in 0..32 {
            // A projective point with a random non-trivial Z.
            let p = G1Projective::rand(&mut rng);
            let s = Fq::rand(&mut rng);
            let q = G1Projective::new_unchecked(p.x * s.square(), p.y * s.square() * s, p.z * s);
            assert_eq!(p, q);
            let d = projective_to_xyzz(&q);
            assert_eq!(xyzz_to_projective(&d), Some(p));
            // XYZZ with ZZ^3 != ZZZ^2 (a valid scaling of X, Y only) also converts.
            let t = Fq::rand(&mut rng);
            let (x, y) = (fq_from_dev(&d.x).unwrap(), fq_from_dev(&d.y).unwrap());
            let (zz, zzz) = (fq_from_dev(&d.zz).unwrap(), fq_from_dev(&d.zzz).unwrap());
            let d2 = DevG1Xyzz {
                x: fq_to_dev(&(x * t)),
                y: fq_to_dev(&(y * t)),
                zz: fq_to_dev(&(zz * t)),
                zzz: fq_to_dev(&(zzz * t)),
            };
            assert_eq!(xyzz_to_projective(&d2), Some(p));
        }
        assert_eq!(
            xyzz_to_projective(&DevG1Xyzz::default()),
            Some(G1Projective::zero())
        );
        assert_eq!(
            projective_to_xyzz(&G1Projective::zero()),
            DevG1Xyzz::default()
        );
    }

    #[test]
    fn layout_g2_roundtrip() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let mut pts: Vec<G2Affine> = (0..16)
            .map(|_| G2Projective::rand(&mut rng).into_affine())
            .collect();
        pts.push(G2Affine::identity());
        pts.push(G2Affine::generator());
        let dev = g2_affines_to_dev(&pts);
        assert_eq!(dev[16], DevG2Affine::default());
        for (p, d) in pts.iter().zip(&dev).filter(|(p, _)| !p.is_zero()) {
            // c0 then c1, each arkworks' Montgomery limbs.
            assert_eq!((d.x.c0.0, d.x.c1.0), (p.x.c0.0 .0, p.x.c1.0 .0));
            assert_eq!((d.y.c0.0, d.y.c1.0), (p.y.c0.0 .0, p.y.c1.0 .0));
        }
        for (p, d) in pts.iter().zip(&dev) {
            assert_eq!(g2_affine_from_dev(d), Some(*p));
        }
        // Off-curve and unreduced data are refused.
        let mut bad = dev[0];
        bad.y = bad.x;
        assert_eq!(g2_affine_from_dev(&bad), None);
        let mut bad = dev[0];
        bad.x.c1 = DevFq(Fq::MODULUS.0);
        assert_eq!(g2_affine_from_dev(&bad), None);
        assert_eq!(fq2_from_dev(&bad.x), None);
        let mut bad = dev[0];
        bad.y.c0 = DevFq([u64::MAX; 6]);
        assert_eq!(g2_affine_from_dev(&bad), None);
    }

    #[test]
    fn layout_g2_xyzz_roundtrip() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        for _ in 0..16 {
            // A Jacobian point with a random non-trivial Z.
            let p = G2Projective::rand(&mut rng);
            let s = Fq2::rand(&mut rng);
            let q = G2Projective::new_unchecked(p.x * s.square(), p.y * s.square() * s, p.z * s);
            assert_eq!(p, q);
            let d = g2_projective_to_xyzz(&q);
            let back = g2_xyzz_to_projective(&d).expect("reduced");
            assert_eq!(back, p);
            assert!(back.into_affine().is_on_curve());
            // XYZZ with ZZ³ ≠ ZZZ² (X, Y, ZZ, ZZZ all scaled by t) also converts.
            let t = Fq2::rand(&mut rng);
            let f = |c: &DevFq2| fq2_to_dev(&(fq2_from_dev(c).unwrap() * t));
            let d2 = DevG2Xyzz {
                x: f(&d.x),
                y: f(&d.y),
                zz: f(&d.zz),
                zzz: f(&d.zzz),
            };
            assert_eq!(g2_xyzz_to_projective(&d2), Some(p));
            // Affine (ZZ = ZZZ = 1), as the device's first addition leaves it.
            let a = p.into_affine();
            let one = fq2_to_dev(&Fq2::one());
            let d3 = DevG2Xyzz {
                x: fq2_to_dev(&a.x),
                y: fq2_to_dev(&a.y),
                zz: one,
                zzz: one,
            };
            assert_eq!(g2_xyzz_to_projective(&d3), Some(p));
        }
        assert_eq!(
            g2_xyzz_to_projective(&DevG2Xyzz::default()),
            Some(G2Projective::zero())
        );
        assert_eq!(
            g2_projective_to_xyzz(&G2Projective::zero()),
            DevG2Xyzz::default()
        );
        // An unreduced coordinate (the 0xA5 poison) is refused.
        let poison = DevFq([0xa5a5_a5a5_a5a5_a5a5; 6]);
        let mut bad = g2_projective_to_xyzz(&G2Projective::rand(&mut rng));
        bad.zzz.c1 = poison;
        assert_eq!(g2_xyzz_to_projective(&bad), None);
    }
}
