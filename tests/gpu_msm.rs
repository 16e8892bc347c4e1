//! G1 MSM, batch addition and the 0/1/other split against arkworks, and each Pippenger
//! stage against a CPU model of it.
//!
//! GPU only: without a GPU every test fails (the CPU profile filters `gpu_*` out).
//! Outputs are poisoned before the launches (the stage runners and the plain entry
//! points do it), every device check runs twice on the same inputs (a result that
//! moves between runs is a race), and results are decoded with the checked layout
//! functions (off-curve or unreduced data is an error). Set TWOLOCK_TEST_SEED to vary
//! the inputs.
#![cfg(feature = "cuda")]

use std::sync::{Arc, OnceLock};

use ark_bls12_381::{G1Affine, G1Projective, G2Affine, G2Projective};
use ark_ec::{AffineRepr, CurveGroup, VariableBaseMSM};
use ark_ff::{BigInteger, One, PrimeField, UniformRand, Zero};
use cudarc::driver::CudaStream;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use twolock::device::cuda::g2::{batch_add_g2, DeviceG2Bases, G2Scratch};
use twolock::device::cuda::layout::fr_as_dev;
use twolock::device::cuda::msm::{
    self, batch_add, msm_enqueue, msm_split, random_scalars, read_points, signed_digits, stages,
    walk_bases, AffineRounds, Bitmap, DeviceBases, DeviceScalars, MsmResults, MsmWorkspace,
    ScalarsRef, WindowPlan,
};
use twolock::device::cuda::{AllocKind, CudaError, DevFr, Gpu};
use twolock::device::ScalarClasses;
use twolock::Fr;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => panic!("gpu_* tests need a CUDA GPU: {e}"),
    })
}

fn stream() -> Arc<CudaStream> {
    gpu().new_stream().expect("stream")
}

fn seed(salt: u64) -> u64 {
    let base = std::env::var("TWOLOCK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x35_u64);
    base ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn rng(salt: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed(salt))
}

/// Independent random bases (slow; small n) or a random walk (fast; large n).
fn bases(n: usize, salt: u64) -> Vec<G1Affine> {
    if n <= 256 {
        let mut r = rng(salt);
        (0..n)
            .map(|_| G1Projective::rand(&mut r).into_affine())
            .collect()
    } else {
        walk_bases(n, seed(salt))
    }
}

fn upload(s: &Arc<CudaStream>, points: &[G1Affine]) -> DeviceBases {
    DeviceBases::upload(gpu(), s, points, AllocKind::StreamOrdered).expect("bases upload")
}

fn reference(points: &[G1Affine], scalars: &[Fr]) -> G1Projective {
    G1Projective::msm(&points[..scalars.len()], scalars).expect("arkworks msm")
}

/// The device MSM of host scalars equals arkworks, twice.
fn check(points: &[G1Affine], scalars: &[Fr], what: &str) {
    let s = stream();
    let dev = upload(&s, points);
    let want = reference(points, scalars);
    for run in 0..2 {
        let got = msm::msm(gpu(), &s, dev.view(), ScalarsRef::Host(scalars)).expect("msm");
        assert_eq!(got, want, "{what}: n = {}, run {run}", scalars.len());
    }
}

/// The split MSM equals arkworks, three times on one classification (a run must leave
/// no state that changes the next).
fn check_split(points: &[G1Affine], scalars: &[Fr], what: &str) {
    let s = stream();
    let dev = upload(&s, points);
    let want = reference(points, scalars);
    let split = ScalarClasses::classify(scalars);
    for run in 0..3 {
        let got = msm_split(gpu(), &s, dev.view(), &split).expect("msm_split");
        assert_eq!(got, want, "{what}: split, n = {}, run {run}", scalars.len());
    }
}

fn scalar_mix(n: usize, salt: u64, p_zero: f64, p_one: f64) -> Vec<Fr> {
    let mut r = rng(salt);
    (0..n)
        .map(|_| {
            let x: f64 = r.gen();
            if x < p_zero {
                Fr::zero()
            } else if x < p_zero + p_one {
                Fr::one()
            } else {
                Fr::rand(&mut r)
            }
        })
        .collect()
}

/// Scalars whose every c-bit window (below bit 254) equals `v`.
fn every_window(c: u32, v: u64) -> Fr {
    let mut k = ark_ff::BigInt::<4>::zero();
    let mut w = 0;
    while w + c <= 254 {
        let mut t = ark_ff::BigInt::<4>::from(v);
        t <<= w;
        k.add_with_carry(&t);
        w += c;
    }
    Fr::from_bigint(k).expect("below r")
}

const SIZES: [usize; 16] = [
    0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1023, 1025, 4097,
];

#[test]
fn gpu_msm_small_sizes_random() {
    let points = bases(4097, 1);
    for (i, &n) in SIZES.iter().enumerate() {
        let scalars = random_scalars(n, seed(100 + i as u64));
        check(&points, &scalars, "random");
    }
}

#[test]
fn gpu_msm_powers_of_two_plus_minus_one() {
    let points = bases((1 << 16) + 1, 2);
    for k in [4u32, 8, 12, 15, 16] {
        for n in [(1usize << k) - 1, 1 << k, (1 << k) + 1] {
            check(&points, &random_scalars(n, seed(200 + n as u64)), "2^k ± 1");
        }
    }
}

#[test]
fn gpu_msm_special_scalars() {
    let points = bases(4097, 3);
    let x = Fr::rand(&mut rng(3));
    for n in [1usize, 31, 33, 1000, 4097] {
        for (name, v) in [
            ("zero", Fr::zero()),
            ("one", Fr::one()),
            ("r-1", -Fr::one()),
            ("equal", x),
        ] {
            let scalars = vec![v; n];
            check(&points, &scalars, name);
            check_split(&points, &scalars, name);
        }
    }
}

#[test]
fn gpu_msm_infinity_bases() {
    let mut points = bases(1025, 4);
    let scalars = random_scalars(1025, seed(4));
    check(&vec![G1Affine::identity(); 1025], &scalars, "all infinity");
    for p in points.iter_mut().step_by(3) {
        *p = G1Affine::identity();
    }
    check(&points, &scalars, "every third infinity");
    check_split(
        &points,
        &scalar_mix(1025, 4, 0.3, 0.3),
        "every third infinity",
    );
}

#[test]
fn gpu_msm_duplicate_and_negated_bases() {
    let p = G1Projective::rand(&mut rng(5)).into_affine();
    let q = G1Projective::rand(&mut rng(6)).into_affine();
    let x = Fr::rand(&mut rng(7));
    // Same base, same scalar: the bucket adds P to itself (the doubling case).
    check(&vec![p; 300], &vec![x; 300], "duplicates, equal scalars");
    // P and -P with one scalar: the same bucket, cancelling (the P + (-P) case).
    let pm: Vec<G1Affine> = (0..300)
        .map(|i| {
            if i % 2 == 0 {
                p
            } else {
                (-p.into_group()).into_affine()
            }
        })
        .collect();
    check(&pm, &vec![x; 300], "P and -P");
    check(&pm[..299], &vec![x; 299], "P and -P, odd count");
    // One base with s and r - s: same magnitude digits, opposite signs.
    let s_and_neg: Vec<Fr> = (0..300).map(|i| if i % 2 == 0 { x } else { -x }).collect();
    check(&vec![q; 300], &s_and_neg, "s and -s");
    // Duplicated bases with random scalars.
    let dup: Vec<G1Affine> = (0..2000).map(|i| if i % 7 < 3 { p } else { q }).collect();
    check(&dup, &random_scalars(2000, seed(8)), "two distinct bases");
}

#[test]
fn gpu_msm_signed_digit_boundary() {
    // For the plan's c at each size: every window at 2^(c-1) (largest positive digit),
    // 2^(c-1) + 1 (negative, carry into every next window) and 2^c - 1 (carry chain).
    for n in [33usize, 1025, 1 << 16] {
        let c = WindowPlan::for_len(n).c;
        let points = bases(n, 9);
        for v in [1u64 << (c - 1), (1u64 << (c - 1)) + 1, (1u64 << c) - 1] {
            check(&points, &vec![every_window(c, v); n], "boundary, all equal");
            let mut mixed = random_scalars(n, seed(10 + v));
            mixed
                .iter_mut()
                .step_by(2)
                .for_each(|s| *s = every_window(c, v));
            check(&points, &mixed, "boundary, mixed");
        }
    }
}

#[test]
fn gpu_msm_skewed_zero_one() {
    let n = (1 << 16) + 1;
    let points = bases(n, 11);
    for (pz, po) in [
        (0.9, 0.09),
        (0.5, 0.49),
        (0.0, 1.0),
        (1.0, 0.0),
        (0.0, 0.0),
        (0.99, 0.0),
    ] {
        let scalars = scalar_mix(n, 12, pz, po);
        check(&points, &scalars, "skewed");
        check_split(&points, &scalars, "skewed");
    }
}

#[test]
fn gpu_batch_add_bitmap() {
    let s = stream();
    let mut points = bases(70_003, 13);
    points[5] = G1Affine::identity();
    points[6] = points[7];
    points[9] = (-points[8].into_group()).into_affine();
    let dev = upload(&s, &points);
    let mut r = rng(13);
    for n in [0usize, 1, 31, 32, 33, 1000, 70_003] {
        for density in [0.0, 0.01, 0.5, 1.0] {
            let bits: Vec<bool> = (0..n).map(|_| r.gen::<f64>() < density).collect();
            let mut words = vec![0u32; n.div_ceil(32)];
            bits.iter()
                .enumerate()
                .filter(|(_, b)| **b)
                .for_each(|(i, _)| words[i / 32] |= 1 << (i % 32));
            // Bits past n must be ignored.
            if let Some(w) = words.last_mut() {
                if n % 32 != 0 {
                    *w |= !0 << (n % 32);
                }
            }
            let want: G1Projective = bits
                .iter()
                .zip(&points)
                .filter(|(b, _)| **b)
                .map(|(_, p)| p.into_group())
                .sum();
            for run in 0..2 {
                let got = batch_add(
                    gpu(),
                    &s,
                    dev.view(),
                    Bitmap {
                        words: &words,
                        len: n,
                    },
                )
                .expect("batch_add");
                assert_eq!(got, want, "n = {n}, density {density}, run {run}");
            }
        }
    }
}

#[test]
fn gpu_msm_split_mixes() {
    let n = 20_000;
    let points = bases(n, 14);
    for (pz, po) in [(0.3, 0.3), (0.0, 0.5), (0.5, 0.0), (0.8, 0.2)] {
        check_split(&points, &scalar_mix(n, 15, pz, po), "split mix");
    }
    check_split(&points, &[], "split, empty");
    check_split(&points, &[Fr::one()], "split, one");
}

#[test]
fn gpu_msm_device_scalars_and_ranges() {
    let s = stream();
    let n = 5000;
    let points = bases(n + 10, 16);
    let dev = upload(&s, &points);
    let scalars = random_scalars(n, seed(16));
    let mut buf = gpu().alloc_async::<DevFr>(&s, n).expect("alloc");
    s.memcpy_htod(fr_as_dev(&scalars), &mut buf)
        .expect("upload");
    for (range, offset) in [(0..n, 0usize), (17..n, 3), (n..n, 0)] {
        let view = dev
            .slice(offset..offset + range.len() + 5)
            .expect("bases slice");
        let want = reference(&points[offset..], &scalars[range.clone()]);
        for run in 0..2 {
            let d = DeviceScalars::new(&buf, range.clone()).expect("scalar range");
            let got = msm::msm(gpu(), &s, view, ScalarsRef::Device(d)).expect("msm");
            assert_eq!(got, want, "range {range:?}, run {run}");
        }
    }
}

#[test]
fn gpu_msm_windows_per_pass_and_slots() {
    let s = stream();
    let n = 3000;
    let points = bases(n, 17);
    let dev = upload(&s, &points);
    let sets: Vec<Vec<Fr>> = (0..3)
        .map(|i| random_scalars(n - i * 7, seed(170 + i as u64)))
        .collect();
    for wpp in [Some(1), Some(3), None] {
        let mut ws = MsmWorkspace::with_windows_per_pass(gpu(), &s, n, wpp, AllocKind::Sync)
            .expect("workspace");
        let mut out = MsmResults::alloc(gpu(), &s, 4, AllocKind::StreamOrdered).expect("out");
        out.poison(gpu(), &s).expect("poison");
        for run in 0..2 {
            for (i, sc) in sets.iter().enumerate() {
                msm_enqueue(
                    gpu(),
                    &s,
                    &mut ws,
                    dev.view(),
                    ScalarsRef::Host(sc),
                    &mut out,
                    i,
                )
                .expect("enqueue");
            }
            let got = read_points(gpu(), &s, &out);
            // Slot 3 was never written: it still holds poison, which must be refused.
            assert!(got.is_err(), "poisoned slot decoded as a point");
            let mut out3 = MsmResults::alloc(gpu(), &s, 3, AllocKind::StreamOrdered).expect("out");
            for (i, sc) in sets.iter().enumerate() {
                msm_enqueue(
                    gpu(),
                    &s,
                    &mut ws,
                    dev.view(),
                    ScalarsRef::Host(sc),
                    &mut out3,
                    i,
                )
                .expect("enqueue");
            }
            let got = read_points(gpu(), &s, &out3).expect("read");
            for (i, sc) in sets.iter().enumerate() {
                assert_eq!(
                    got[i],
                    reference(&points, sc),
                    "wpp {wpp:?}, slot {i}, run {run}"
                );
            }
        }
        ws.free().expect("free");
    }
}

/// Stage (c') (batch-affine rounds before the XYZZ accumulation) at several round
/// counts and sub-pass sizes, and off, over the edge catalogue: chords, tangents (a
/// base added to itself), P + (−P), infinity bases, zero, one and r − 1, boundary
/// digits, skew. Small windows (c = 4) make deep rounds; sub-passes of one window
/// (entries clamped up to n) make many. Every workspace is poisoned first and every
/// case runs twice against arkworks.
#[test]
fn gpu_msm_batch_affine_rounds() {
    let s = stream();
    let n = 1 << 13;
    let mut points = bases(n, 30);
    for i in (0..n).step_by(97) {
        points[i] = G1Affine::identity();
    }
    for i in (1..n).step_by(89) {
        points[i] = points[i - 1];
    }
    for i in (2..n).step_by(83) {
        points[i] = (-points[i - 1].into_group()).into_affine();
    }
    let p = G1Projective::rand(&mut rng(31)).into_affine();
    let minus_p = (-p.into_group()).into_affine();
    let x = Fr::rand(&mut rng(32));
    let pm: Vec<G1Affine> = (0..3001)
        .map(|i| if i % 2 == 0 { p } else { minus_p })
        .collect();
    let same = vec![p; 3000];
    let mut inf_third = points.clone();
    inf_third
        .iter_mut()
        .step_by(3)
        .for_each(|q| *q = G1Affine::identity());
    let cases: Vec<(&str, &[G1Affine], Vec<Fr>)> = vec![
        ("random", &points, random_scalars(n, seed(33))),
        ("random, odd n", &points, random_scalars(4097, seed(34))),
        ("all equal", &points, vec![x; 5000]),
        ("one base, equal scalars", &same, vec![x; 3000]),
        ("P and -P", &pm, vec![x; 3001]),
        (
            "every third infinity",
            &inf_third,
            random_scalars(n, seed(35)),
        ),
        ("r-1", &points, vec![-Fr::one(); 2000]),
        ("zero", &points, vec![Fr::zero(); 1000]),
        ("boundary c=4", &points, boundary_and_random(n, 4, 36)),
        (
            "boundary planner",
            &points,
            boundary_and_random(n, WindowPlan::for_len(n).c, 37),
        ),
        ("skewed", &points, scalar_mix(n, 38, 0.9, 0.09)),
    ];
    let wants: Vec<G1Projective> = cases.iter().map(|(_, b, k)| reference(b, k)).collect();
    let affine = |rounds, entries, batch| {
        Some(AffineRounds {
            rounds,
            entries,
            batch,
        })
    };
    let configs = [
        (None, None),
        (None, affine(1, 1, 256)),
        (None, AffineRounds::DEFAULT.into()),
        (None, affine(3, 1 << 15, 7)),
        (Some(WindowPlan::with_bits(4)), affine(12, 1 << 30, 1000)),
        (Some(WindowPlan::with_bits(4)), affine(2, 1, 1)),
    ];
    for (plan, aff) in configs {
        let mut ws = MsmWorkspace::with_affine(gpu(), &s, n, plan, aff, AllocKind::StreamOrdered)
            .expect("workspace");
        let mut out = MsmResults::alloc(gpu(), &s, 1, AllocKind::StreamOrdered).expect("out");
        for ((what, b, k), want) in cases.iter().zip(&wants) {
            let dev = upload(&s, b);
            for run in 0..2 {
                ws.poison(gpu(), &s).expect("poison");
                out.poison(gpu(), &s).expect("poison");
                let sc = ScalarsRef::Host(k);
                msm_enqueue(gpu(), &s, &mut ws, dev.view(), sc, &mut out, 0).expect("enqueue");
                let got = read_points(gpu(), &s, &out).expect("read")[0];
                let rounds = aff.map_or(0, |a| a.for_plan(k.len(), ws.plan_for(k.len())));
                assert_eq!(
                    got,
                    *want,
                    "{what}: n {}, plan {plan:?}, {aff:?} ({rounds} rounds), run {run}",
                    k.len()
                );
            }
        }
        ws.free().expect("free");
    }
    // The rounds a plan gets: none without two entries a bucket on average.
    let d = AffineRounds::DEFAULT;
    assert_eq!(d.for_plan(1 << 24, WindowPlan::with_bits(16)), d.rounds);
    assert_eq!(
        d.for_plan(1 << 16, WindowPlan::with_bits(16)),
        1.min(d.rounds)
    );
    assert_eq!(d.for_plan((1 << 16) - 1, WindowPlan::with_bits(16)), 0);
    assert_eq!(d.for_plan(1000, WindowPlan::with_bits(16)), 0);
}

#[test]
fn gpu_msm_explicit_window_plans() {
    // Widths the planner does not pick (17, 18), its cap (16) and its cap from 2^26
    // scalars (20, here with few entries a bucket), on a workspace with the plan
    // forced: a power of two and an odd size, random and boundary digits.
    let s = stream();
    let points = bases((1 << 14) + 1, 19);
    let dev = upload(&s, &points);
    for c in [16u32, 17, 18, 20] {
        let plan = WindowPlan::with_bits(c);
        for n in [1usize << 14, 12_345] {
            let scalars = boundary_and_random(n, c, 190 + u64::from(c));
            let want = reference(&points, &scalars);
            let mut ws = MsmWorkspace::with_plan(gpu(), &s, n, plan, AllocKind::StreamOrdered)
                .expect("workspace");
            assert_eq!(ws.plan_for(n), plan);
            let mut out = MsmResults::alloc(gpu(), &s, 1, AllocKind::StreamOrdered).expect("out");
            for run in 0..2 {
                out.poison(gpu(), &s).expect("poison");
                let sc = ScalarsRef::Host(&scalars);
                msm_enqueue(gpu(), &s, &mut ws, dev.view(), sc, &mut out, 0).expect("enqueue");
                let got = read_points(gpu(), &s, &out).expect("read")[0];
                assert_eq!(got, want, "c {c}, n {n}, run {run}");
            }
            ws.free().expect("free");
        }
    }
    // A plan that is not c-bit windows over 256 bits, or c out of range, is refused.
    let short = WindowPlan { c: 16, windows: 3 };
    let e = MsmWorkspace::with_plan(gpu(), &s, 10, short, AllocKind::StreamOrdered).unwrap_err();
    assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    let wide = msm::MAX_WINDOW_BITS + 1;
    let e = msm::bench_msm_with_bits(gpu(), &[10], 3, Some(wide)).unwrap_err();
    assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    // The bench reports the plan it ran with.
    let t = msm::bench_msm_with_bits(gpu(), &[10], 3, Some(17)).expect("bench");
    assert!(t[0].consistent && t[0].plan == WindowPlan::with_bits(17));
}

#[test]
fn gpu_msm_errors_are_values() {
    let s = stream();
    let points = bases(10, 18);
    let dev = upload(&s, &points);
    let scalars = random_scalars(11, seed(18));
    let e = msm::msm(gpu(), &s, dev.view(), ScalarsRef::Host(&scalars)).unwrap_err();
    assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    let mut ws = MsmWorkspace::new(gpu(), &s, 5, AllocKind::StreamOrdered).expect("workspace");
    let mut out = MsmResults::alloc(gpu(), &s, 1, AllocKind::StreamOrdered).expect("out");
    let e = msm_enqueue(
        gpu(),
        &s,
        &mut ws,
        dev.view(),
        ScalarsRef::Host(&scalars[..8]),
        &mut out,
        0,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    let e = msm_enqueue(
        gpu(),
        &s,
        &mut ws,
        dev.view(),
        ScalarsRef::Host(&scalars[..2]),
        &mut out,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    assert!(dev.slice(5..11).is_err());
    ws.free().expect("free");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]
    #[test]
    fn gpu_msm_proptest(log in 0u32..=16, frac in 0.5f64..=1.0, pz in 0.0f64..0.5, po in 0.0f64..0.5, salt in any::<u64>()) {
        let n = ((1usize << log) as f64 * frac) as usize;
        let points = walk_bases(n.max(1), salt);
        let scalars = scalar_mix(n, salt, pz, po);
        check(&points, &scalars, "proptest");
        check_split(&points, &scalars, "proptest");
    }
}

fn large(log: u32) {
    let n = 1usize << log;
    let points = walk_bases(n, seed(u64::from(log)));
    let scalars = random_scalars(n, seed(1000 + u64::from(log)));
    check(&points, &scalars, "large");
}

#[test]
fn gpu_msm_2_20() {
    large(20);
}

#[test]
fn gpu_msm_2_22() {
    large(22);
}

#[test]
fn gpu_msm_2_24() {
    large(24);
}

// ---------------------------------------------------------------------------------
// Stages

fn boundary_and_random(n: usize, c: u32, salt: u64) -> Vec<Fr> {
    let mut v = random_scalars(n, seed(salt));
    let specials = [
        Fr::zero(),
        Fr::one(),
        -Fr::one(),
        every_window(c, 1 << (c - 1)),
        every_window(c, (1 << (c - 1)) + 1),
        every_window(c, (1 << c) - 1),
    ];
    v.iter_mut()
        .zip(specials.iter().cycle())
        .step_by(3)
        .for_each(|(s, x)| *s = *x);
    v
}

#[test]
fn gpu_stage_from_montgomery() {
    let s = stream();
    let scalars = boundary_and_random(1000, 13, 20);
    for run in 0..2 {
        let got = stages::from_montgomery(gpu(), &s, &scalars).expect("from_montgomery");
        let want: Vec<[u64; 4]> = scalars.iter().map(|x| x.into_bigint().0).collect();
        assert_eq!(got, want, "run {run}");
    }
}

#[test]
fn gpu_stage_digits() {
    let s = stream();
    for c in [4u32, 7, 13, 16, 20] {
        let plan = WindowPlan::with_bits(c);
        let scalars = boundary_and_random(777, c, 21);
        let canonical: Vec<[u64; 4]> = scalars.iter().map(|x| x.into_bigint().0).collect();
        let cpu: Vec<Vec<i64>> = canonical.iter().map(|k| signed_digits(k, plan)).collect();
        for (w_begin, w_count) in [
            (0, plan.windows),
            (0, 1),
            (plan.windows - 1, 1),
            (plan.windows / 2, plan.windows - plan.windows / 2),
        ] {
            for run in 0..2 {
                let got =
                    stages::digits(gpu(), &s, &canonical, plan, w_begin, w_count).expect("digits");
                for wl in 0..w_count as usize {
                    for i in 0..canonical.len() {
                        let want = msm::encode_digit(cpu[i][w_begin as usize + wl]);
                        assert_eq!(
                            got[wl * canonical.len() + i],
                            want,
                            "c {c}, window {}, scalar {i}, run {run}",
                            w_begin as usize + wl
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_stage_bucket_sort() {
    let s = stream();
    for (c, n, wc) in [
        (4u32, 1000usize, 3u32),
        (9, 5000, 2),
        (13, 70_000, 1),
        (16, 3000, 4),
    ] {
        let nb = 1usize << (c - 1);
        let mut r = rng(22 + u64::from(c));
        let raw: Vec<i64> = (0..n * wc as usize)
            .map(|i| match i % 4 {
                0 => 0,
                1 => nb as i64, // the boundary bucket
                _ => r.gen_range(-(nb as i64 - 1)..=nb as i64),
            })
            .collect();
        let digits: Vec<u32> = raw.iter().map(|&d| msm::encode_digit(d)).collect();
        let index: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
        for (run, base_index) in [None, Some(&index[..]), None].into_iter().enumerate() {
            let sorted =
                stages::bucket_sort(gpu(), &s, &digits, (n, c, wc), base_index).expect("sort");
            let keys = wc as usize * nb;
            assert_eq!(sorted.offsets.len(), keys + 1);
            assert_eq!(sorted.offsets[0], 0);
            assert!(
                sorted.offsets.windows(2).all(|w| w[0] <= w[1]),
                "offsets not monotone"
            );
            assert_eq!(
                sorted.offsets[keys] as usize,
                raw.iter().filter(|&&d| d != 0).count()
            );
            // Each bucket holds exactly its (index, sign) entries, in any order.
            let mut want: Vec<Vec<u32>> = vec![Vec::new(); keys];
            for (j, &d) in raw.iter().enumerate() {
                let (wl, i) = (j / n, j % n);
                if d != 0 {
                    let idx = base_index.map_or(i as u32, |b| b[i]);
                    want[wl * nb + d.unsigned_abs() as usize - 1]
                        .push(idx | if d < 0 { 1 << 31 } else { 0 });
                }
            }
            for (k, w) in want.iter_mut().enumerate() {
                let mut got = sorted.entries
                    [sorted.offsets[k] as usize..sorted.offsets[k + 1] as usize]
                    .to_vec();
                got.sort_unstable();
                w.sort_unstable();
                assert_eq!(&got, w, "c {c}, key {k}, run {run}");
            }
        }
    }
}

/// Bucket sums on the CPU from a sorted layout.
fn cpu_buckets(points: &[G1Affine], sorted: &stages::Sorted) -> Vec<G1Projective> {
    sorted
        .offsets
        .windows(2)
        .map(|w| {
            sorted.entries[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&e| {
                    let p = points[(e & 0x7fff_ffff) as usize].into_group();
                    if e >> 31 == 1 {
                        -p
                    } else {
                        p
                    }
                })
                .sum()
        })
        .collect()
}

#[test]
fn gpu_stage_accumulate() {
    let s = stream();
    let n = 3000;
    let mut points = bases(n, 23);
    points[3] = G1Affine::identity();
    points[4] = (-points[5].into_group()).into_affine();
    let dev = upload(&s, &points);
    let c = 7;
    let plan = WindowPlan::with_bits(c);
    // Random scalars, and all-equal scalars (one heavy bucket per window).
    let x = Fr::rand(&mut rng(23));
    for scalars in [
        random_scalars(n, seed(23)),
        vec![x; n],
        scalar_mix(n, 24, 0.0, 0.9),
    ] {
        let canonical: Vec<[u64; 4]> = scalars.iter().map(|x| x.into_bigint().0).collect();
        let digits = stages::digits(gpu(), &s, &canonical, plan, 0, plan.windows).expect("digits");
        let sorted =
            stages::bucket_sort(gpu(), &s, &digits, (n, c, plan.windows), None).expect("sort");
        let want = cpu_buckets(&points, &sorted);
        let total = sorted.entries.len();
        // One slice per entry with pairwise folding (deepest head tree), a few slices,
        // one slice, more slices than entries, and the pipeline's shape.
        for (slices, fold) in [
            (total.max(1), 2u32),
            (7, 3),
            (1, 32),
            (total + 100, 2),
            (50_000, 32),
        ] {
            for run in 0..2 {
                let got = stages::accumulate(gpu(), &s, dev.view(), &sorted, (slices, fold))
                    .expect("accumulate");
                assert_eq!(got, want, "slices {slices}, fold {fold}, run {run}");
            }
        }
    }
}

/// Stage (c') alone: one batch-affine round from sorted entries, then one from its own
/// output, against the CPU model (each run's points summed in pairs, in order, an odd
/// one out copied): chords, a tangent (one base twice), P + (−P), infinity with
/// infinity and with a point, empty runs and runs of 1, 2, 3, 5, 7, 64 and 1000, at
/// several thread counts (one thread: a single inversion over every pair).
#[test]
fn gpu_stage_pair_round() {
    let s = stream();
    let mut points = bases(300, 40);
    points[0] = G1Affine::identity();
    let dev = upload(&s, &points);
    let mut r = rng(41);
    let runs = [0usize, 1, 2, 3, 7, 0, 64, 1000, 2, 2, 2, 5];
    const NEG: u32 = 1 << 31;
    let (mut offsets, mut entries) = (vec![0u32], Vec::new());
    for (k, &len) in runs.iter().enumerate() {
        for j in 0..len {
            entries.push(match (k, j) {
                (8, _) => 5, // P + P: the tangent
                (9, 0) => 6, // P + (−P)
                (9, _) => 6 | NEG,
                (10, _) => 0,            // infinity + infinity
                (11, 0 | 3) => 0,        // infinity + P, P + infinity
                (11, _) => 7 + j as u32, // and an odd one out
                _ => r.gen_range(0..300u32) | if r.gen() { NEG } else { 0 },
            });
        }
        offsets.push(entries.len() as u32);
    }
    let value = |e: u32| {
        let p = points[(e & !NEG) as usize];
        if e & NEG != 0 {
            -p
        } else {
            p
        }
    };
    let model = |offs: &[u32], input: &[G1Affine]| {
        let (mut o, mut out) = (vec![0u32], Vec::new());
        for w in offs.windows(2) {
            for pair in input[w[0] as usize..w[1] as usize].chunks(2) {
                let sum: G1Projective = pair.iter().map(|p| p.into_group()).sum();
                out.push(sum.into_affine());
            }
            o.push(out.len() as u32);
        }
        (o, out)
    };
    let inputs: Vec<G1Affine> = entries.iter().map(|&e| value(e)).collect();
    let want = model(&offsets, &inputs);
    let want2 = model(&want.0, &want.1);
    for threads in [1usize, 3, 64, 5000] {
        for run in 0..2 {
            let got = stages::pair_round(gpu(), &s, dev.view(), &offsets, &entries, None, threads)
                .expect("round from entries");
            assert_eq!(got, want, "from entries, {threads} threads, run {run}");
            let got2 =
                stages::pair_round(gpu(), &s, dev.view(), &got.0, &[], Some(&got.1), threads)
                    .expect("round from points");
            assert_eq!(got2, want2, "from points, {threads} threads, run {run}");
        }
    }
    // Bad input is an error before any launch.
    let view = dev.view();
    assert!(stages::pair_round(gpu(), &s, view, &[0, 2], &[1], None, 1).is_err());
    assert!(stages::pair_round(gpu(), &s, view, &[0, 1], &[300], None, 1).is_err());
    assert!(stages::pair_round(gpu(), &s, view, &[0, 1], &[1], None, 0).is_err());
    assert!(stages::pair_round(gpu(), &s, view, &[2, 1], &[1], None, 1).is_err());
}

#[test]
fn gpu_stage_reduce() {
    let s = stream();
    let mut r = rng(25);
    let g = G1Projective::rand(&mut r);
    for (c, wc) in [(4u32, 3u32), (8, 2), (12, 1)] {
        let nb = 1usize << (c - 1);
        let buckets: Vec<G1Projective> = (0..wc as usize * nb)
            .map(|i| match i % 5 {
                0 => G1Projective::zero(),
                1 => g, // equal buckets: the running sum doubles
                _ => G1Projective::rand(&mut r),
            })
            .collect();
        let want: Vec<G1Projective> = buckets
            .chunks(nb)
            .map(|w| {
                w.iter()
                    .enumerate()
                    .map(|(j, b)| *b * Fr::from(j as u64 + 1))
                    .sum()
            })
            .collect();
        for span in [1u32, 2, 8, nb as u32] {
            for run in 0..2 {
                let got = stages::reduce(gpu(), &s, &buckets, (c, wc, span)).expect("reduce");
                assert_eq!(got, want, "c {c}, span {span}, run {run}");
            }
        }
    }
}

#[test]
fn gpu_bench_msm_smoke() {
    let t = msm::bench_msm(gpu(), &[10, 12], 3).expect("bench");
    assert_eq!(t.len(), 2);
    for x in &t {
        assert!(x.consistent, "results moved between runs at 2^{}", x.log_n);
        assert!(x.median_ms > 0.0 && x.stages_ms.iter().any(|(n, _)| n == "accumulate"));
    }
}

// ---------------------------------------------------------------------------------
// G2 batch addition (B_G2's ones)

/// n G2 bases: independent (n ≤ 256) or P_0 + i·D ([`msm::walk_points`]).
fn g2_bases(n: usize, salt: u64) -> Vec<G2Affine> {
    if n > 256 {
        return msm::walk_points::<G2Projective>(n, salt);
    }
    let mut r = rng(salt);
    let v: Vec<G2Projective> = (0..n).map(|_| G2Projective::rand(&mut r)).collect();
    G2Projective::normalize_batch(&v)
}

fn g2_upload(s: &Arc<CudaStream>, points: &[G2Affine]) -> DeviceG2Bases {
    DeviceG2Bases::upload(gpu(), s, points, AllocKind::StreamOrdered).expect("g2 bases upload")
}

/// The bitmap of `bits`, with every bit past bits.len() in the last word set (the
/// device must ignore them).
fn bitmap_words(bits: &[bool]) -> Vec<u32> {
    let n = bits.len();
    let mut words = vec![0u32; n.div_ceil(32)];
    (bits.iter().enumerate())
        .filter(|(_, b)| **b)
        .for_each(|(i, _)| words[i / 32] |= 1 << (i % 32));
    if let Some(w) = words.last_mut() {
        if n % 32 != 0 {
            *w |= !0 << (n % 32);
        }
    }
    words
}

/// arkworks' sum of the selected points (in parallel for large n).
fn g2_reference(points: &[G2Affine], bits: &[bool]) -> G2Projective {
    (bits.par_iter().zip(points))
        .filter(|(b, _)| **b)
        .map(|(_, p)| p.into_group())
        .reduce(G2Projective::zero, |a, b| a + b)
}

/// One batch addition of n = bits.len() through the scratch (poisoned first; the bitmap
/// in a buffer of its own), then through the standalone entry point.
fn g2_run(
    s: &Arc<CudaStream>,
    scratch: &mut G2Scratch,
    dev: &DeviceG2Bases,
    words: &[u32],
    n: usize,
) -> (G2Projective, G2Projective) {
    let mut buf = gpu()
        .alloc_async::<u32>(s, words.len())
        .expect("bitmap alloc");
    if !words.is_empty() {
        s.memcpy_htod(words, &mut buf).expect("bitmap upload");
    }
    scratch.poison(gpu(), s).expect("poison");
    // SAFETY: `buf` holds ⌈n/32⌉ words, written on `s` before the kernels and freed
    // only after the sync below.
    unsafe { scratch.enqueue(gpu(), s, dev, buf.raw(), n) }.expect("g2 enqueue");
    gpu().sync(s, "g2 test").expect("sync");
    let got = scratch.read_sum(gpu(), s).expect("g2 read_sum");
    buf.free().expect("bitmap free");
    let ones = Bitmap { words, len: n };
    let standalone = batch_add_g2(gpu(), s, dev, ones).expect("batch_add_g2");
    (got, standalone)
}

#[test]
fn gpu_g2_batch_add_matches_arkworks() {
    let s = stream();
    let len = (1 << 12) + 40;
    let mut points = g2_bases(len, 40);
    // The exceptional cases, each alone in its bitmap word(s) in the `adversarial` set,
    // so they reach the formulas as such (a thread sums the set bits of a run of words
    // into one partial; the fold sums FOLD = 8 consecutive partials per thread):
    // infinity as a base (5); P + P in one partial (33, 34: the doubling path) and
    // P + (−P) (67, 68: infinity), then a base after infinity (70); two equal partials
    // (words 8 and 9) and two opposite ones (words 16 and 17) in one fold chunk, which
    // a partial sum reaches only when there are more than 64 partials (n > 2048).
    points[5] = G2Affine::identity();
    points[34] = points[33];
    points[68] = (-points[67].into_group()).into_affine();
    points[288] = points[256];
    points[544] = (-points[512].into_group()).into_affine();
    let adversarial = [5usize, 33, 34, 67, 68, 70, 256, 288, 512, 544, 4000, 4096];
    let dev = g2_upload(&s, &points);
    let mut scratch =
        G2Scratch::alloc(gpu(), &s, len, AllocKind::StreamOrdered).expect("g2 scratch");
    let mut r = rng(40);
    for n in [0usize, 1, 31, 32, 33, 1000, (1 << 12) - 1, (1 << 12) + 1] {
        let sets: [(&str, Vec<bool>); 4] = [
            ("none", vec![false; n]),
            ("all", vec![true; n]),
            ("half", (0..n).map(|_| r.gen::<bool>()).collect()),
            (
                "adversarial",
                (0..n).map(|i| adversarial.contains(&i)).collect(),
            ),
        ];
        for (what, bits) in &sets {
            let want = g2_reference(&points, bits);
            let words = bitmap_words(bits);
            for run in 0..2 {
                let (got, standalone) = g2_run(&s, &mut scratch, &dev, &words, n);
                assert_eq!(got, want, "n = {n}, {what}, run {run}");
                assert_eq!(standalone, want, "n = {n}, {what}, standalone, run {run}");
            }
        }
    }
    let all_inf = vec![G2Affine::identity(); 100];
    let dev_inf = g2_upload(&s, &all_inf);
    let words = bitmap_words(&[true; 100]);
    let (got, standalone) = g2_run(&s, &mut scratch, &dev_inf, &words, 100);
    assert_eq!(
        (got, standalone),
        (G2Projective::zero(), G2Projective::zero())
    );
    scratch.free().expect("free");
    dev.free().expect("free");
    dev_inf.free().expect("free");
}

#[test]
fn gpu_g2_batch_add_2_20() {
    let s = stream();
    let n = 1 << 20;
    let points = g2_bases(n, 41);
    let dev = g2_upload(&s, &points);
    let mut r = rng(41);
    let bits: Vec<bool> = (0..n).map(|_| r.gen::<bool>()).collect();
    let want = g2_reference(&points, &bits);
    let words = bitmap_words(&bits);
    let mut scratch = G2Scratch::alloc(gpu(), &s, n, AllocKind::Sync).expect("g2 scratch");
    assert!(scratch.bytes() <= G2Scratch::bytes_needed(n));
    for run in 0..2 {
        let (got, standalone) = g2_run(&s, &mut scratch, &dev, &words, n);
        assert_eq!(got, want, "2^20, run {run}");
        assert_eq!(standalone, want, "2^20, standalone, run {run}");
    }
    scratch.free().expect("free");
    dev.free().expect("free");
}

#[test]
fn gpu_g2_batch_add_errors_are_values() {
    let s = stream();
    let points = g2_bases(10, 42);
    let dev = g2_upload(&s, &points);
    let words = [u32::MAX; 2];
    let invalid = |r: Result<G2Projective, CudaError>| {
        let e = r.expect_err("an error");
        assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
    };
    // More bits than bases; a bitmap shorter than ⌈len/32⌉ words.
    invalid(batch_add_g2(
        gpu(),
        &s,
        &dev,
        Bitmap {
            words: &words,
            len: 11,
        },
    ));
    invalid(batch_add_g2(
        gpu(),
        &s,
        &dev,
        Bitmap {
            words: &words[..0],
            len: 1,
        },
    ));
    let mut buf = gpu().alloc_async::<u32>(&s, 2).expect("alloc");
    s.memcpy_htod(&words[..], &mut buf).expect("upload");
    let mut scratch = G2Scratch::alloc(gpu(), &s, 5, AllocKind::StreamOrdered).expect("scratch");
    // Nothing enqueued yet; then n past the scratch, and past the bases.
    invalid(scratch.read_sum(gpu(), &s));
    for n in [6usize, 11] {
        // SAFETY: `buf` holds 2 ≥ ⌈n/32⌉ words and outlives the sync below.
        let e = unsafe { scratch.enqueue(gpu(), &s, &dev, buf.raw(), n) }.unwrap_err();
        assert!(matches!(e, CudaError::InvalidInput(_)), "{e}");
        invalid(scratch.read_sum(gpu(), &s));
    }
    // A good run, then the scratch poisoned under its result: the poison is refused.
    // SAFETY: as above.
    unsafe { scratch.enqueue(gpu(), &s, &dev, buf.raw(), 5) }.expect("enqueue");
    gpu().sync(&s, "g2 errors").expect("sync");
    let want: G2Projective = points[..5].iter().map(|p| p.into_group()).sum();
    assert_eq!(scratch.read_sum(gpu(), &s).expect("sum"), want);
    scratch.poison(gpu(), &s).expect("poison");
    invalid(scratch.read_sum(gpu(), &s));
    // A scratch for 2^22 bases has a partial per resident thread: at least one block
    // of 64 per SM, within the advertised bound.
    let big = G2Scratch::alloc(gpu(), &s, 1 << 22, AllocKind::StreamOrdered).expect("scratch");
    let sms = u64::from(gpu().sm_count().expect("sm count"));
    assert!(big.bytes() >= sms * 64 * 384, "{} bytes", big.bytes());
    assert!(big.bytes() <= G2Scratch::bytes_needed(1 << 22));
    let freed = [scratch.free(), big.free(), buf.free(), dev.free()];
    freed.into_iter().collect::<Result<(), _>>().expect("free");
    gpu().sync(&s, "g2 errors free").expect("sync");
}

/// B_G1's split MSM and B_G2 beside it (`G2Scratch::enqueue_with_g1`): the ones by
/// batch addition, the others by the G2 point stages on B_G1's sorted digits. Against
/// arkworks on both curves, over mixes of 0/1/other scalars and G2 bases with the
/// bucket cases: infinity, P and −P under one digit (a bucket sums to infinity), a base
/// twice under one digit (the doubling path), r − 1 and 2 as scalars, and no others.
#[test]
fn gpu_g2_beside_b_g1_matches_arkworks() {
    let s = stream();
    let kind = AllocKind::StreamOrdered;
    let max = (1 << 16) + 3;
    let g1 = bases(max, 50);
    let mut g2 = g2_bases(max, 51);
    g2[3] = G2Affine::identity();
    g2[10] = (-g2[9].into_group()).into_affine();
    g2[12] = g2[11];
    let (dev1, dev2) = (upload(&s, &g1), g2_upload(&s, &g2));
    let mut ws = MsmWorkspace::new(gpu(), &s, max, kind).expect("workspace");
    let mut scratch = G2Scratch::alloc_beside(gpu(), &s, max, &ws, kind).expect("g2 scratch");
    let mut out = MsmResults::alloc(gpu(), &s, 1, kind).expect("results");
    let mut r = rng(52);
    let minus_one = -Fr::one();
    let mut cases: Vec<(String, Vec<Fr>)> = Vec::new();
    for n in [0usize, 1, 2, 33, 1000, (1 << 12) + 1, max] {
        // Mostly 0 and 1, as boolean circuits give, and the bucket cases at 3..=12.
        let mut k: Vec<Fr> = (0..n)
            .map(|_| match r.gen_range(0..10) {
                0..=3 => Fr::zero(),
                4..=7 => Fr::one(),
                _ => Fr::rand(&mut r),
            })
            .collect();
        let same = Fr::rand(&mut r);
        for (i, v) in [
            (3, same),
            (9, same),
            (10, same),
            (11, minus_one),
            (12, minus_one),
        ] {
            if i < n {
                k[i] = v;
            }
        }
        if n > 13 {
            k[13] = Fr::from(2u64);
        }
        cases.push((format!("mixed {n}"), k));
    }
    cases.push((
        "zeros and ones".into(),
        (0..777).map(|i| Fr::from((i % 2) as u64)).collect(),
    ));
    cases.push(("all r - 1".into(), vec![minus_one; 4097]));
    cases.push(("all equal".into(), vec![Fr::rand(&mut r); 4097]));
    for (what, k) in &cases {
        let n = k.len();
        let want1 = G1Projective::msm(&g1[..n], k).expect("g1 reference");
        let want2 = G2Projective::msm(&g2[..n], k).expect("g2 reference");
        let split = ScalarClasses::classify(k);
        for run in 0..2 {
            ws.poison(gpu(), &s).expect("poison");
            out.poison(gpu(), &s).expect("poison");
            scratch.poison(gpu(), &s).expect("poison");
            let (ws_, out_) = (&mut ws, &mut out);
            scratch
                .enqueue_with_g1(gpu(), &s, ws_, dev1.view(), &dev2, &split, out_, 0)
                .expect("enqueue");
            gpu().sync(&s, "beside").expect("sync");
            let got1 = read_points(gpu(), &s, &out).expect("read g1")[0];
            let ones = scratch.read_sum(gpu(), &s).expect("read ones");
            let others = scratch.read_others(gpu(), &s).expect("read others");
            assert_eq!(got1, want1, "{what}: B_G1, run {run}");
            assert_eq!(
                others.map(|o| ones + o),
                Some(want2),
                "{what}: B_G2, run {run}"
            );
        }
    }
    // Misuse is a typed error: fewer G2 bases than scalars, a scratch for another
    // workspace, and the others read before any enqueue.
    let k = random_scalars(100, 53);
    let split = ScalarClasses::classify(&k);
    let few = g2_upload(&s, &g2[..50]);
    let err = scratch.enqueue_with_g1(gpu(), &s, &mut ws, dev1.view(), &few, &split, &mut out, 0);
    assert!(matches!(err, Err(CudaError::InvalidInput(_))), "{err:?}");
    let mut other_ws = MsmWorkspace::new(gpu(), &s, 1 << 10, kind).expect("workspace");
    let err = scratch.enqueue_with_g1(
        gpu(),
        &s,
        &mut other_ws,
        dev1.view(),
        &dev2,
        &split,
        &mut out,
        0,
    );
    assert!(matches!(err, Err(CudaError::InvalidInput(_))), "{err:?}");
    scratch.poison(gpu(), &s).expect("poison");
    assert!(scratch.read_others(gpu(), &s).is_err());
    for r in [
        ws.free(),
        other_ws.free(),
        scratch.free(),
        out.free(),
        dev1.free(),
    ] {
        r.expect("free");
    }
    for r in [dev2.free(), few.free()] {
        r.expect("free");
    }
}
