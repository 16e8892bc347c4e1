//! sppark as a benchmark peer (feature `peer-sppark`): its MSM against arkworks'
//! `VariableBaseMSM::msm` and its NTT against ark-poly's `Radix2EvaluationDomain::fft`.
//!
//! GPU only: without a GPU every `gpu_*` test fails (the CPU profile filters them out).
//! The `peer_*` tests check input validation and need no GPU. Set TWOLOCK_TEST_SEED to
//! vary the inputs.
#![cfg(feature = "peer-sppark")]

use ark_bls12_381::{Fr, G1Affine, G1Projective};
use ark_ec::{AffineRepr, PrimeGroup, ScalarMul, VariableBaseMSM};
use ark_ff::{Field, One, UniformRand, Zero};
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use twolock::peer::{sppark_msm_g1, sppark_ntt_forward, PeerError, PeerTiming};

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

fn random_scalars(n: usize, salt: u64) -> Vec<Fr> {
    let mut r = rng(salt);
    (0..n).map(|_| Fr::rand(&mut r)).collect()
}

/// Random bases: a random point times random scalars (a fixed-base batch mul, fast).
fn random_bases(n: usize, salt: u64) -> Vec<G1Affine> {
    let mut r = rng(salt ^ 0xba5e);
    let base = G1Projective::rand(&mut r);
    base.batch_mul(&random_scalars(n, salt ^ 0x5ca1))
}

fn reference_msm(bases: &[G1Affine], scalars: &[Fr]) -> G1Projective {
    G1Projective::msm(bases, scalars).expect("arkworks msm: equal lengths")
}

fn check_timing<T>(t: &PeerTiming<T>, runs: usize, what: &str) {
    assert_eq!(t.runs, runs, "{what}");
    assert!(
        t.median_ms.is_finite() && t.median_ms > 0.0,
        "{what}: median {} ms",
        t.median_ms
    );
    eprintln!(
        "{what}: sppark median {:.3} ms over {runs} runs",
        t.median_ms
    );
}

fn check_msm(bases: &[G1Affine], scalars: &[Fr], runs: usize, what: &str) {
    let want = reference_msm(bases, scalars);
    let got = sppark_msm_g1(bases, scalars, runs)
        .unwrap_or_else(|e| panic!("{what}: sppark MSM failed: {e}"));
    assert_eq!(got.value, want, "{what}: n = {}", bases.len());
    check_timing(&got, runs, what);
}

#[test]
fn gpu_peer_msm_1000() {
    let n = 1000;
    check_msm(&random_bases(n, 1), &random_scalars(n, 2), 3, "msm 1000");
}

#[test]
fn gpu_peer_msm_2_12() {
    let n = 1 << 12;
    check_msm(&random_bases(n, 3), &random_scalars(n, 4), 3, "msm 2^12");
}

#[test]
fn gpu_peer_msm_2_16() {
    let n = 1 << 16;
    check_msm(&random_bases(n, 5), &random_scalars(n, 6), 5, "msm 2^16");
}

/// Bases at infinity, repeated and opposite bases, and the scalars 0, 1, -1, 2.
#[test]
fn gpu_peer_msm_edge_cases() {
    let n = 2048;
    let mut bases = random_bases(n, 7);
    let mut scalars = random_scalars(n, 8);
    for i in (0..n).step_by(97) {
        bases[i] = G1Affine::zero();
    }
    for i in (1..n).step_by(89) {
        bases[i] = bases[i - 1];
    }
    for i in (3..n).step_by(101) {
        bases[i] = -bases[i - 1];
    }
    let specials = [Fr::zero(), Fr::one(), -Fr::one(), Fr::from(2u64)];
    for (k, i) in (0..n).step_by(13).enumerate() {
        scalars[i] = specials[k % specials.len()];
    }
    check_msm(&bases, &scalars, 2, "msm edge cases");

    // All scalars zero: the identity.
    let zeros = vec![Fr::zero(); n];
    let got = sppark_msm_g1(&bases, &zeros, 1).expect("sppark MSM of zeros");
    assert!(got.value.is_zero(), "MSM with zero scalars");
}

/// Tiny MSMs (below one warp of points): 1·G, then 1..=33 random points.
#[test]
fn gpu_peer_msm_tiny() {
    let g = G1Affine::generator();
    let got = sppark_msm_g1(&[g], &[Fr::one()], 1).expect("sppark MSM of one point");
    assert_eq!(got.value, G1Projective::generator(), "1·G");
    for n in [1, 2, 31, 32, 33] {
        check_msm(
            &random_bases(n, 200 + n as u64),
            &random_scalars(n, 300 + n as u64),
            1,
            &format!("msm {n}"),
        );
    }
}

fn check_ntt(values: &[Fr], runs: usize, what: &str) {
    let domain = Radix2EvaluationDomain::<Fr>::new(values.len()).expect("radix-2 domain");
    assert_eq!(domain.size(), values.len(), "{what}: domain size");
    let want = domain.fft(values);
    let got = sppark_ntt_forward(values, runs)
        .unwrap_or_else(|e| panic!("{what}: sppark NTT failed: {e}"));
    assert_eq!(got.value.len(), want.len(), "{what}: length");
    if let Some(i) = (0..want.len()).find(|&i| got.value[i] != want[i]) {
        panic!(
            "{what}: n = {}, first difference at index {i} of {}",
            values.len(),
            want.len()
        );
    }
    check_timing(&got, runs, what);
}

#[test]
fn gpu_peer_ntt_2_10() {
    check_ntt(&random_scalars(1 << 10, 9), 3, "ntt 2^10");
}

#[test]
fn gpu_peer_ntt_2_16() {
    check_ntt(&random_scalars(1 << 16, 10), 5, "ntt 2^16");
}

/// Sizes on both sides of sppark's kernel switches (<= 2^10, <= 2^18, above).
#[test]
fn gpu_peer_ntt_sizes() {
    for lg in [5u32, 11, 17, 19] {
        check_ntt(
            &random_scalars(1 << lg, 100 + u64::from(lg)),
            2,
            &format!("ntt 2^{lg}"),
        );
    }
}

/// The smallest sizes the wrapper accepts (2 and 4 elements).
#[test]
fn gpu_peer_ntt_tiny() {
    for lg in [1u32, 2] {
        check_ntt(
            &random_scalars(1 << lg, 100 + u64::from(lg)),
            1,
            &format!("ntt 2^{lg}"),
        );
    }
}

/// Inputs whose transforms are known in closed form.
#[test]
fn gpu_peer_ntt_structured() {
    let n = 1 << 12;
    // A delta at 0 transforms to all ones.
    let mut delta = vec![Fr::zero(); n];
    delta[0] = Fr::one();
    let got = sppark_ntt_forward(&delta, 1).expect("sppark NTT of delta");
    assert!(got.value.iter().all(|v| v.is_one()), "NTT(delta_0) = 1");
    // A constant c transforms to (n·c, 0, ..., 0).
    let c = Fr::from(7u64);
    let got = sppark_ntt_forward(&vec![c; n], 1).expect("sppark NTT of a constant");
    assert_eq!(got.value[0], c * Fr::from(n as u64), "NTT(c)[0]");
    assert!(got.value[1..].iter().all(|v| v.is_zero()), "NTT(c)[1..]");
    // A delta at 1 gives the powers of the root of unity, in natural order.
    let mut delta1 = vec![Fr::zero(); n];
    delta1[1] = Fr::one();
    let got = sppark_ntt_forward(&delta1, 1).expect("sppark NTT of delta_1");
    let domain = Radix2EvaluationDomain::<Fr>::new(n).expect("radix-2 domain");
    let mut w = Fr::one();
    for (i, v) in got.value.iter().enumerate() {
        assert_eq!(*v, w, "NTT(delta_1)[{i}] = omega^{i}");
        w *= domain.group_gen();
    }
    assert_eq!(domain.group_gen().pow([n as u64]), Fr::one());
}

/// Validation happens before anything runs: no GPU needed.
#[test]
fn peer_invalid_inputs_are_typed_errors() {
    let g = G1Affine::generator();
    let cases: Vec<Result<(), PeerError>> = vec![
        sppark_msm_g1(&[], &[], 1).map(drop),
        sppark_msm_g1(&[g, g], &[Fr::one()], 1).map(drop),
        sppark_msm_g1(&[g], &[Fr::one()], 0).map(drop),
        sppark_ntt_forward(&[], 1).map(drop),
        sppark_ntt_forward(&[Fr::one()], 1).map(drop),
        sppark_ntt_forward(&[Fr::one(); 6], 1).map(drop),
        sppark_ntt_forward(&[Fr::one(); 8], 0).map(drop),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        assert!(
            matches!(c, Err(PeerError::InvalidInput(_))),
            "case {i}: {c:?}"
        );
    }
}
