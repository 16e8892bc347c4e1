//! Circuits and keys: satisfiability, the synthesizer against the fast path, typed errors,
//! real keys that verify, synthetic keys that are well-formed, and hostile key bytes.

use ark_ec::AffineRepr;
use ark_ff::{AdditiveGroup, Field, UniformRand};
use ark_groth16::{prepare_verifying_key, r1cs_to_qap::LibsnarkReduction, Groth16};
use ark_relations::gr1cs::{
    ConstraintSynthesizer, ConstraintSystem, OptimizationGoal, SynthesisMode, R1CS_PREDICATE_LABEL,
};
use ark_serialize::CanonicalSerialize;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::path::PathBuf;
use twolock::circuits::{CircuitError, CircuitSpec, ConstraintMatrices, Family};
use twolock::keys::{
    load_key, real_key_in, save_key, synthetic_key, validate_points, KeyError, KeyMaterial, Trust,
    G1_BYTES, G2_BYTES, MAX_REAL_LOG_CONSTRAINTS,
};
use twolock::{Curve, Fr};

fn spec(family: Family, log: u32, inputs: usize) -> CircuitSpec {
    CircuitSpec::new(family, log, inputs).expect("valid spec")
}

/// A fresh cache directory for one test (nextest runs each test in its own process).
fn cache_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("twolock-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_family_is_satisfied_at_several_sizes() {
    for family in Family::ALL {
        for (log, inputs) in [(2, 1), (4, 1), (4, 7), (8, 3), (12, 1), (14, 16)] {
            let s = spec(family, log, inputs);
            let m = s.constraints().unwrap();
            assert_eq!(
                m.num_constraints + m.num_instance_variables,
                1 << log,
                "{s:?}"
            );
            assert_eq!(s.domain_size(), 1 << log);
            assert_eq!(m.shape(), s.shape().unwrap());
            for seed in [0, 1] {
                m.check(&s.assignment(seed).unwrap())
                    .unwrap_or_else(|e| panic!("{s:?}: {e}"));
            }
            assert_ne!(s.assignment(0).unwrap(), s.assignment(1).unwrap());
        }
    }
}

#[test]
fn synthesizer_matrices_equal_fast_matrices() {
    for family in Family::ALL {
        for (log, inputs, density) in [(3, 1, 3), (4, 2, 3), (7, 5, 1), (10, 3, 6), (11, 1, 3)] {
            let s = spec(family, log, inputs).with_density(density).unwrap();
            let fast = s.constraints().unwrap();
            let z = s.assignment(42).unwrap();
            // Prove mode, as a prover would synthesize.
            let cs = ConstraintSystem::<Fr>::new_ref();
            cs.set_optimization_goal(OptimizationGoal::Constraints);
            s.circuit(Some(42))
                .generate_constraints(cs.clone())
                .unwrap();
            cs.finalize();
            assert!(cs.is_satisfied().unwrap(), "{s:?}");
            let m = &cs.to_matrices().unwrap()[R1CS_PREDICATE_LABEL];
            assert_matrices_eq(&s, m, &fast);
            let zc = [
                cs.instance_assignment().unwrap(),
                cs.witness_assignment().unwrap(),
            ]
            .concat();
            assert!(zc == z, "{s:?}: synthesized assignment differs");
            // Setup mode, as ark-groth16's generator synthesizes.
            let cs = ConstraintSystem::<Fr>::new_ref();
            cs.set_optimization_goal(OptimizationGoal::Constraints);
            cs.set_mode(SynthesisMode::Setup);
            s.circuit(None).generate_constraints(cs.clone()).unwrap();
            cs.finalize();
            assert_matrices_eq(&s, &cs.to_matrices().unwrap()[R1CS_PREDICATE_LABEL], &fast);
            assert_eq!(cs.num_instance_variables(), fast.num_instance_variables);
            assert_eq!(cs.num_witness_variables(), fast.num_witness_variables);
        }
    }
}

fn assert_matrices_eq(
    s: &CircuitSpec,
    m: &[ark_relations::gr1cs::Matrix<Fr>],
    fast: &ConstraintMatrices,
) {
    assert_eq!(m.len(), 3);
    for (name, got, want) in [
        ("A", &m[0], fast.a()),
        ("B", &m[1], fast.b()),
        ("C", &m[2], fast.c()),
    ] {
        assert_eq!(got.len(), want.len(), "{s:?}: {name} rows");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("{s:?}: {name} row {i}: {:?} != {:?}", got[i], want[i]);
        }
    }
}

#[test]
fn a_flipped_witness_value_fails_at_its_defining_row() {
    for family in Family::ALL {
        let s = spec(family, 8, 2);
        let m = s.constraints().unwrap();
        let z = s.assignment(3).unwrap();
        let first_witness = m.num_instance_variables;
        // In every family witness k is defined by row k, and no earlier row reads it. Adding
        // 2 keeps no bit a bit (adding 1 would turn a fresh 0 into a valid 1).
        for k in [0, 3, 30, 31] {
            let mut bad = z.clone();
            bad[first_witness + k] += Fr::from(2u64);
            match m.check(&bad) {
                Err(CircuitError::Unsatisfied { constraint }) => assert_eq!(constraint, k, "{s:?}"),
                other => panic!("{s:?}: expected Unsatisfied, got {other:?}"),
            }
        }
        let mut bad = z.clone();
        bad[1] = bad[1].double() + Fr::ONE;
        assert!(
            matches!(m.check(&bad), Err(CircuitError::Unsatisfied { .. })),
            "{s:?}"
        );
    }
}

#[test]
fn malformed_assignments_are_typed_errors() {
    let s = spec(Family::Sparse, 6, 1);
    let m = s.constraints().unwrap();
    let z = s.assignment(0).unwrap();
    let n = z.len();
    assert!(matches!(
        m.check(&z[..n - 1]),
        Err(CircuitError::WitnessLength { expected, got }) if expected == n && got == n - 1
    ));
    assert!(matches!(
        m.check(&[]),
        Err(CircuitError::WitnessLength { got: 0, .. })
    ));
    let mut bad = z.clone();
    bad[0] = Fr::ZERO;
    assert!(matches!(m.check(&bad), Err(CircuitError::ConstantNotOne)));
}

#[test]
fn out_of_range_specs_are_typed_errors() {
    use CircuitError::*;
    assert!(matches!(
        CircuitSpec::new(Family::Mimc, 1, 1),
        Err(SizeOutOfRange {
            log_constraints: 1,
            ..
        })
    ));
    assert!(matches!(
        CircuitSpec::new(Family::Boolean, 27, 1),
        Err(SizeOutOfRange {
            min: 2,
            max: 26,
            ..
        })
    ));
    assert!(matches!(
        CircuitSpec::new(Family::Sparse, 4, 0),
        Err(NoInputs)
    ));
    assert!(matches!(
        CircuitSpec::new(Family::Sparse, 4, 8),
        Err(TooManyInputs {
            num_inputs: 8,
            max: 7
        })
    ));
    assert!(CircuitSpec::new(Family::Sparse, 26, 1).is_ok());
    // Fields are public and specs deserialize: every entry point validates again.
    let raw = CircuitSpec {
        family: Family::Mimc,
        log_constraints: 40,
        num_inputs: 1,
        density: 3,
    };
    assert!(matches!(raw.constraints(), Err(SizeOutOfRange { .. })));
    assert!(matches!(raw.assignment(0), Err(SizeOutOfRange { .. })));
    let cs = ConstraintSystem::<Fr>::new_ref();
    assert!(raw.circuit(Some(0)).generate_constraints(cs).is_err());
    let msg = CircuitSpec::new(Family::Mimc, 30, 1)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("2^30") && msg.contains("2..=26"), "{msg}");
}

#[test]
fn family_names() {
    let names: Vec<String> = Family::ALL.iter().map(|f| f.to_string()).collect();
    assert_eq!(names, ["mimc", "boolean", "sparse"]);
    let json = serde_json::to_string(&spec(Family::Boolean, 4, 1)).unwrap();
    assert!(json.contains("\"boolean\""), "{json}");
    let back: CircuitSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec(Family::Boolean, 4, 1));
    use clap::ValueEnum;
    assert_eq!(Family::from_str("sparse", false).unwrap(), Family::Sparse);
}

/// The reference proof path: `constraints()` matrices with a key from setup on `circuit()`.
fn prove_and_verify(key: &KeyMaterial, witness_seed: u64) -> bool {
    let m = key.spec.constraints().unwrap();
    let z = key.spec.assignment(witness_seed).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(witness_seed);
    let (r, s) = (Fr::rand(&mut rng), Fr::rand(&mut rng));
    let proof = Groth16::<Curve, LibsnarkReduction>::create_proof_with_reduction_and_matrices(
        &key.pk,
        r,
        s,
        m.as_slice(),
        m.num_instance_variables,
        m.num_constraints,
        &z,
    )
    .unwrap();
    let pvk = prepare_verifying_key(&key.pk.vk);
    let inputs = &z[1..m.num_instance_variables];
    let ok = Groth16::<Curve>::verify_proof(&pvk, &proof, inputs).unwrap();
    // The same proof must fail for other public inputs.
    let mut wrong = inputs.to_vec();
    wrong[0] += Fr::ONE;
    assert!(!Groth16::<Curve>::verify_proof(&pvk, &proof, &wrong).unwrap());
    ok
}

#[test]
fn real_keys_verify_proofs_from_the_fast_matrices() {
    let dir = cache_dir("real");
    for family in Family::ALL {
        for (log, inputs) in [(4, 1), (4, 3), (6, 2)] {
            let s = spec(family, log, inputs);
            let key = real_key_in(&dir, &s, 11).unwrap();
            assert!(!key.is_synthetic());
            assert_eq!(key.provenance.to_string(), "real");
            twolock::keys::check_lengths(&key.pk, &s.constraints().unwrap()).unwrap();
            for seed in [1, 2] {
                assert!(prove_and_verify(&key, seed), "{s:?} seed {seed}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn synthetic_keys_have_the_right_lengths_and_valid_points() {
    for family in Family::ALL {
        let s = spec(family, 10, 3);
        let key = synthetic_key(&s, 5).unwrap();
        let m = s.constraints().unwrap();
        twolock::keys::check_lengths(&key.pk, &m).unwrap();
        assert_eq!(key.pk.h_query.len(), (1 << 10) - 1);
        assert_eq!(key.pk.l_query.len(), m.num_witness_variables);
        assert_eq!(key.pk.vk.gamma_abc_g1.len(), 4);
        validate_points(&key.pk).unwrap();
        assert!(key.pk.a_query.iter().all(|p| !p.is_zero()));
        assert!(key.is_synthetic());
    }
    let s = spec(Family::Mimc, 4, 1);
    assert!(
        !prove_and_verify(&synthetic_key(&s, 1).unwrap(), 1),
        "a synthetic key verified"
    );
}

#[test]
fn real_keys_are_cached_and_bad_cache_files_are_replaced() {
    let dir = cache_dir("cache");
    let s = spec(Family::Boolean, 5, 2);
    let first = real_key_in(&dir, &s, 3).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let modified = || std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    let written = modified();
    let second = real_key_in(&dir, &s, 3).unwrap();
    assert_eq!(modified(), written, "a cache hit must not rewrite the key");
    assert!(first.pk == second.pk);
    assert_eq!(first.vk_digest(), second.vk_digest());
    // Another key seed is another key.
    assert_ne!(
        real_key_in(&dir, &s, 4).unwrap().vk_digest(),
        first.vk_digest()
    );
    // A truncated cache file is discarded and rebuilt.
    std::fs::write(&files[0], b"not a key").unwrap();
    let third = real_key_in(&dir, &s, 3).unwrap();
    assert!(third.pk == first.pk);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_keys_stop_at_the_size_limit() {
    let s = spec(Family::Sparse, MAX_REAL_LOG_CONSTRAINTS + 1, 1);
    match real_key_in(&cache_dir("limit"), &s, 0) {
        Err(KeyError::SizeTooLargeForRealKey {
            log_constraints: 21,
            max: 20,
        }) => {}
        other => panic!("expected SizeTooLargeForRealKey, got {other:?}"),
    }
}

#[test]
fn saved_keys_are_arks_uncompressed_layout_and_round_trip() {
    let s = spec(Family::Sparse, 5, 2);
    let key = synthetic_key(&s, 9).unwrap();
    let bytes = save_key(&key.pk);
    let mut ark = Vec::new();
    key.pk.serialize_uncompressed(&mut ark).unwrap();
    assert!(
        bytes == ark,
        "save_key must write ark-serialize's uncompressed layout"
    );
    assert_eq!(
        ark_bls12_381::G1Affine::zero().uncompressed_size(),
        G1_BYTES
    );
    assert_eq!(
        ark_bls12_381::G2Affine::zero().uncompressed_size(),
        G2_BYTES
    );
    for trust in [Trust::Trusted, Trust::Untrusted] {
        assert!(load_key(&bytes, &s, trust).unwrap() == key.pk);
    }
}

#[test]
fn synthetic_keys_are_deterministic_per_seed() {
    let s = spec(Family::Mimc, 6, 1);
    let (a, b) = (synthetic_key(&s, 1).unwrap(), synthetic_key(&s, 1).unwrap());
    assert!(a.pk == b.pk);
    assert_eq!(a.vk_digest(), b.vk_digest());
    assert_eq!(a.vk_digest().len(), 64);
    assert_ne!(a.vk_digest(), synthetic_key(&s, 2).unwrap().vk_digest());
    assert_eq!(a.provenance.to_string(), "SYNTHETIC (does not verify)");
    // Different queries are different walks.
    assert_ne!(a.pk.a_query[..4], a.pk.b_g1_query[..4]);
}

/// Byte offset of `a_query[index]` in the uncompressed layout.
fn a_query_offset(s: &CircuitSpec, index: usize) -> usize {
    let gamma_abc = 1 + s.num_inputs;
    G1_BYTES + 3 * G2_BYTES + 8 + gamma_abc * G1_BYTES + 2 * G1_BYTES + 8 + index * G1_BYTES
}

#[test]
fn truncated_key_bytes_are_reported() {
    let s = spec(Family::Mimc, 6, 2);
    let bytes = save_key(&synthetic_key(&s, 1).unwrap().pk);
    for cut in [0, 10, a_query_offset(&s, 5) + 7, bytes.len() - 1] {
        match load_key(&bytes[..cut], &s, Trust::Trusted) {
            Err(KeyError::Truncated { context }) => assert!(!context.is_empty()),
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
    match load_key(&bytes[..a_query_offset(&s, 5) + 7], &s, Trust::Untrusted) {
        Err(KeyError::Truncated { context }) => {
            assert!(context.contains("a_query[5]"), "{context}")
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(matches!(
        load_key(&long, &s, Trust::Trusted),
        Err(KeyError::Corrupt { .. })
    ));
    assert!(load_key(&bytes, &s, Trust::Untrusted).is_ok());
}

#[test]
fn bad_points_are_reported_by_query_and_index() {
    let s = spec(Family::Sparse, 6, 2);
    let bytes = save_key(&synthetic_key(&s, 2).unwrap().pk);
    let y_last = a_query_offset(&s, 3) + G1_BYTES - 1;

    // Off the curve: the lowest byte of y flipped.
    let mut off_curve = bytes.clone();
    off_curve[y_last] ^= 1;
    match load_key(&off_curve, &s, Trust::Untrusted) {
        Err(KeyError::PointNotOnCurve {
            query: "a_query",
            index: 3,
        }) => {}
        other => panic!("expected PointNotOnCurve(a_query, 3), got {other:?}"),
    }
    assert!(
        load_key(&off_curve, &s, Trust::Trusted).is_ok(),
        "trusted loads skip point checks"
    );

    // Not a field element: y = 2^381 - 1 > p.
    let mut not_field = bytes.clone();
    not_field[y_last + 1 - 48..=y_last].copy_from_slice(&[0xff; 48]);
    not_field[y_last + 1 - 48] = 0x1f;
    match load_key(&not_field, &s, Trust::Trusted) {
        Err(KeyError::Corrupt { reason }) => assert!(reason.contains("a_query[3]"), "{reason}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }

    // On the curve, outside the prime-order subgroup.
    let mut x = ark_bls12_381::Fq::ONE;
    let outsider = loop {
        if let Some(p) = ark_bls12_381::G1Affine::get_point_from_x_unchecked(x, false) {
            if !p.is_in_correct_subgroup_assuming_on_curve() {
                break p;
            }
        }
        x += ark_bls12_381::Fq::ONE;
    };
    let mut encoded = Vec::new();
    outsider.serialize_uncompressed(&mut encoded).unwrap();
    let mut cofactor = bytes.clone();
    let at = a_query_offset(&s, 3);
    cofactor[at..at + G1_BYTES].copy_from_slice(&encoded);
    match load_key(&cofactor, &s, Trust::Untrusted) {
        Err(KeyError::NotInSubgroup {
            query: "a_query",
            index: 3,
        }) => {}
        other => panic!("expected NotInSubgroup(a_query, 3), got {other:?}"),
    }
}

#[test]
fn keys_for_another_spec_are_length_mismatches() {
    let s = spec(Family::Boolean, 6, 2);
    let bytes = save_key(&synthetic_key(&s, 1).unwrap().pk);
    match load_key(&bytes, &spec(Family::Boolean, 6, 1), Trust::Trusted) {
        Err(KeyError::LengthMismatch {
            query: "gamma_abc_g1",
            expected: 2,
            got: 3,
        }) => {}
        other => panic!("expected LengthMismatch on gamma_abc_g1, got {other:?}"),
    }
    match load_key(&bytes, &spec(Family::Boolean, 7, 2), Trust::Trusted) {
        Err(KeyError::LengthMismatch {
            query: "a_query", ..
        }) => {}
        other => panic!("expected LengthMismatch on a_query, got {other:?}"),
    }
    // A huge length prefix is refused before anything is allocated.
    let mut huge = bytes.clone();
    let at = a_query_offset(&s, 0) - 8;
    huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        load_key(&huge, &s, Trust::Trusted),
        Err(KeyError::LengthMismatch {
            query: "a_query",
            ..
        })
    ));
}

/// Release-mode timing of the fast path; run with
/// `cargo nextest run --release --test circuits_keys --run-ignored only perf`.
#[test]
#[ignore]
fn perf_fast_path() {
    let log: u32 = std::env::var("TWOLOCK_PERF_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for family in Family::ALL {
        let s = spec(family, log, 4);
        let t = std::time::Instant::now();
        let m = s.constraints().unwrap();
        let tm = t.elapsed();
        let z = s.assignment(1).unwrap();
        let tz = t.elapsed() - tm;
        m.check(&z).unwrap();
        let tc = t.elapsed() - tm - tz;
        let tk = std::time::Instant::now();
        let key = synthetic_key(&s, 1).unwrap();
        println!(
            "{family} 2^{log}: constraints {tm:?}, assignment {tz:?}, check {tc:?}, synthetic key {:?} ({} points)",
            tk.elapsed(),
            key.pk.a_query.len()
        );
    }
}
