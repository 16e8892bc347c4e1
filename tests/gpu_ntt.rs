//! NTTs and the witness map against ark-poly and ark-groth16.
//!
//! GPU only: without a GPU every test fails (the CPU profile filters `gpu_*` out).
//! The transforms are in place, so there is no separate output to poison: a skipped
//! element keeps its input value and mismatches the reference. `ntt_with_scratch`
//! gets a scratch poisoned with 0xA5 bytes (not a reduced scalar), so a read of a
//! scratch element that no pass wrote fails the download's reduction check or the
//! comparison. Every check runs each variant more than once on the same input (a
//! result that moves is a race) and synchronizes with the CUDA error check. Inputs are seeded; set TWOLOCK_TEST_SEED to vary them.
#![cfg(feature = "cuda")]

use std::sync::{Arc, OnceLock};

use ark_ff::{FftField, UniformRand, Zero};
use ark_groth16::r1cs_to_qap::{evaluate_constraint, LibsnarkReduction, R1CSToQAP};
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};
use ark_relations::gr1cs::Matrix;
use cudarc::driver::CudaStream;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use twolock::device::cuda::layout::{fr_as_dev, fr_from_dev};
use twolock::device::cuda::witness_map::witness_map_cpu;
use twolock::device::cuda::{
    bench_ntt, ntt, ntt_with_scratch, witness_map, CudaError, DevFr, Gpu, NttKind,
};
use twolock::Fr;

type Domain = Radix2EvaluationDomain<Fr>;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => panic!("gpu_* tests need a CUDA GPU: {e}"),
    })
}

fn seed(salt: u64) -> u64 {
    let base = std::env::var("TWOLOCK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7_0C_u64);
    base ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// `n` random scalars from `seed`, generated in parallel chunks.
fn random_fr(n: usize, seed: u64) -> Vec<Fr> {
    let mut v = vec![Fr::zero(); n];
    v.par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = ChaCha20Rng::seed_from_u64(seed.wrapping_add(i as u64));
            chunk.iter_mut().for_each(|x| *x = Fr::rand(&mut rng));
        });
    v
}

fn download(
    s: &Arc<CudaStream>,
    buf: &cudarc::driver::CudaSlice<DevFr>,
    what: &'static str,
) -> Vec<Fr> {
    let raw: Vec<DevFr> = s.clone_dtoh(buf).expect("download");
    gpu().sync(s, what).expect("sync after download");
    raw.par_iter()
        .enumerate()
        .map(|(i, d)| {
            fr_from_dev(d).unwrap_or_else(|| panic!("{what}: unreduced value at {i}: {d:?}"))
        })
        .collect()
}

/// A device buffer of n scalars poisoned by `Gpu::poison` (0xA5 bytes, above the modulus).
fn poisoned(s: &Arc<CudaStream>, n: usize) -> cudarc::driver::CudaSlice<DevFr> {
    let mut buf = s.alloc_zeros::<DevFr>(n).expect("alloc scratch");
    gpu().poison(s, &mut buf).expect("poison scratch");
    buf
}

/// One transform on a fresh buffer and stream: upload, transform (in place, or with a
/// poisoned scratch), sync, download.
fn gpu_transform(input: &[Fr], kind: NttKind, with_scratch: bool) -> Vec<Fr> {
    let s = gpu().new_stream().expect("stream");
    let mut buf = s.clone_htod(fr_as_dev(input)).expect("upload");
    if with_scratch {
        let mut scratch = poisoned(&s, input.len());
        ntt_with_scratch(gpu(), &s, &mut buf, &mut scratch, kind).expect("ntt launch");
        gpu()
            .sync(&s, "ntt with scratch")
            .expect("ntt with scratch");
    } else {
        ntt(gpu(), &s, &mut buf, kind).expect("ntt launch");
        gpu().sync(&s, "ntt").expect("ntt");
    }
    download(&s, &buf, "ntt")
}

fn cpu_transform(input: &[Fr], kind: NttKind) -> Vec<Fr> {
    let d = Domain::new(input.len()).expect("domain");
    let coset = d.get_coset(Fr::GENERATOR).expect("coset");
    match kind {
        NttKind::Forward => d.fft(input),
        NttKind::Inverse => d.ifft(input),
        NttKind::CosetForward => coset.fft(input),
        NttKind::CosetInverse => coset.ifft(input),
    }
}

/// GPU `kind` of `input` equals `want`, in place and with a scratch, each twice (once
/// each above 2^20, where a run moves gigabytes).
fn check(input: &[Fr], kind: NttKind, want: &[Fr]) {
    let n = input.len();
    let runs = if n <= 1 << 20 { 2 } else { 1 };
    for run in 0..runs {
        for with_scratch in [false, true] {
            let got = gpu_transform(input, kind, with_scratch);
            if got != want {
                let first = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(0);
                panic!(
                    "{kind:?} of size {n} (scratch: {with_scratch}) differs from ark-poly \
                     (run {run}), first at index {first}"
                );
            }
        }
    }
}

#[test]
fn gpu_ntt_all_kinds_sizes_1_to_20() {
    for log_n in 1..=20u32 {
        let x = random_fr(1 << log_n, seed(u64::from(log_n)));
        for kind in NttKind::ALL {
            check(&x, kind, &cpu_transform(&x, kind));
        }
    }
}

/// Large sizes: two CPU transforms per size; the inverses are checked by mapping
/// ark-poly's own outputs back (ark-poly's ifft(fft(x)) = x).
fn check_large(log_n: u32) {
    let x = random_fr(1 << log_n, seed(100 + u64::from(log_n)));
    let evals = cpu_transform(&x, NttKind::Forward);
    check(&x, NttKind::Forward, &evals);
    check(&evals, NttKind::Inverse, &x);
    drop(evals);
    let coset_evals = cpu_transform(&x, NttKind::CosetForward);
    check(&x, NttKind::CosetForward, &coset_evals);
    check(&coset_evals, NttKind::CosetInverse, &x);
}

#[test]
fn gpu_ntt_2_22() {
    check_large(22);
}

#[test]
fn gpu_ntt_2_24() {
    check_large(24);
}

#[test]
fn gpu_ntt_2_26() {
    check_large(26);
}

#[test]
fn gpu_ntt_edge_inputs() {
    // All zeros, all ones, a single one (a delta), and p − 1 everywhere.
    for log_n in [1u32, 5, 11, 12, 21] {
        let n = 1usize << log_n;
        let mut delta = vec![Fr::zero(); n];
        delta[n / 2 + usize::from(n > 2)] = Fr::from(1u64);
        for x in [
            vec![Fr::zero(); n],
            vec![Fr::from(1u64); n],
            delta,
            vec![-Fr::from(1u64); n],
        ] {
            for kind in NttKind::ALL {
                check(&x, kind, &cpu_transform(&x, kind));
            }
        }
    }
}

#[test]
fn gpu_ntt_concurrent_streams() {
    let jobs: Vec<(u32, NttKind)> = vec![
        (16, NttKind::Forward),
        (18, NttKind::Inverse),
        (20, NttKind::CosetForward),
        (17, NttKind::CosetInverse),
        (20, NttKind::Forward),
        (19, NttKind::CosetInverse),
        (12, NttKind::Inverse),
        (20, NttKind::CosetInverse),
    ];
    let cases: Vec<(Vec<Fr>, NttKind, Vec<Fr>)> = jobs
        .iter()
        .enumerate()
        .map(|(i, &(log_n, kind))| {
            let x = random_fr(1 << log_n, seed(200 + i as u64));
            let want = cpu_transform(&x, kind);
            (x, kind, want)
        })
        .collect();
    for run in 0..2 {
        // One thread per stream, all enqueueing at once.
        std::thread::scope(|scope| {
            for (i, (x, kind, want)) in cases.iter().enumerate() {
                scope.spawn(move || {
                    let got = gpu_transform(x, *kind, i % 2 == 1);
                    assert!(
                        got == *want,
                        "thread job {i} ({kind:?}, 2^{}) run {run}",
                        x.len().trailing_zeros()
                    );
                });
            }
        });
        // One thread, several streams, no sync until everything is enqueued.
        let streams: Vec<_> = cases
            .iter()
            .map(|_| gpu().new_stream().expect("stream"))
            .collect();
        let mut bufs: Vec<_> = cases
            .iter()
            .zip(&streams)
            .map(|((x, _, _), s)| s.clone_htod(fr_as_dev(x)).expect("upload"))
            .collect();
        // Every other job with its own scratch.
        let mut scratches: Vec<_> = cases
            .iter()
            .zip(&streams)
            .map(|((x, _, _), s)| poisoned(s, x.len()))
            .collect();
        for (i, ((((_, kind, _), s), buf), scratch)) in cases
            .iter()
            .zip(&streams)
            .zip(&mut bufs)
            .zip(&mut scratches)
            .enumerate()
        {
            if i % 2 == 0 {
                ntt_with_scratch(gpu(), s, buf, scratch, *kind).expect("launch");
            } else {
                ntt(gpu(), s, buf, *kind).expect("launch");
            }
        }
        for (((_, kind, want), s), buf) in cases.iter().zip(&streams).zip(&bufs) {
            gpu().sync(s, "concurrent ntt").expect("sync");
            assert!(
                download(s, buf, "concurrent ntt") == *want,
                "interleaved {kind:?} run {run}"
            );
        }
    }
}

#[test]
fn gpu_ntt_rejects_bad_sizes() {
    let s = gpu().new_stream().expect("stream");
    let mut buf = s.alloc_zeros::<DevFr>(12).expect("alloc");
    assert!(matches!(
        ntt(gpu(), &s, &mut buf, NttKind::Forward),
        Err(CudaError::InvalidInput(_))
    ));
    let mut one = s.alloc_zeros::<DevFr>(1).expect("alloc");
    ntt(gpu(), &s, &mut one, NttKind::CosetInverse).expect("size 1 is the identity");
    let mut data = s.alloc_zeros::<DevFr>(1 << 12).expect("alloc");
    let mut short = s.alloc_zeros::<DevFr>((1 << 12) - 1).expect("alloc");
    assert!(matches!(
        ntt_with_scratch(gpu(), &s, &mut data, &mut short, NttKind::Forward),
        Err(CudaError::InvalidInput(m)) if m.contains("scratch")
    ));
    gpu().sync(&s, "bad sizes").expect("clean error state");
}

// ---------- witness map ----------

fn gpu_witness_map(a: &[Fr], b: &[Fr], c: &[Fr]) -> Vec<Fr> {
    let s = gpu().new_stream().expect("stream");
    let mut da = s.clone_htod(fr_as_dev(a)).expect("upload a");
    let mut db = s.clone_htod(fr_as_dev(b)).expect("upload b");
    let mut dc = s.clone_htod(fr_as_dev(c)).expect("upload c");
    witness_map(gpu(), &s, &mut da, &mut db, &mut dc).expect("witness map launch");
    gpu().sync(&s, "witness map").expect("witness map");
    download(&s, &da, "witness map")
}

/// Random R1CS with `m` constraints over `num_inputs` instance and `m` witness
/// variables; returns (A, B, C matrices, full assignment).
fn random_r1cs(m: usize, num_inputs: usize, rng: &mut ChaCha20Rng) -> ([Matrix<Fr>; 3], Vec<Fr>) {
    let vars = num_inputs + m;
    let mut z: Vec<Fr> = (0..vars).map(|_| Fr::rand(rng)).collect();
    z[0] = Fr::from(1u64);
    let matrix = |rng: &mut ChaCha20Rng| -> Matrix<Fr> {
        (0..m)
            .map(|_| {
                let terms = rng.gen_range(0..4);
                (0..terms)
                    .map(|_| (Fr::rand(rng), rng.gen_range(0..vars)))
                    .collect()
            })
            .collect()
    };
    ([matrix(rng), matrix(rng), matrix(rng)], z)
}

#[test]
fn gpu_witness_map_matches_ark_groth16() {
    let mut rng = ChaCha20Rng::seed_from_u64(seed(300));
    for (m, num_inputs) in [
        (1usize, 1usize),
        (3, 2),
        (31, 1),
        (33, 4),
        (100, 3),
        (1000, 7),
        (4095, 1),
        (40_000, 5),
        (131_000, 9),
    ] {
        let (mats, z) = random_r1cs(m, num_inputs, &mut rng);
        let want =
            LibsnarkReduction::witness_map_from_matrices::<Fr, Domain>(&mats, num_inputs, m, &z)
                .expect("ark-groth16 witness map");
        let n = Domain::new(m + num_inputs).expect("domain").size();
        let (mut a, mut b, mut c) = (
            vec![Fr::zero(); n],
            vec![Fr::zero(); n],
            vec![Fr::zero(); n],
        );
        for i in 0..m {
            a[i] = evaluate_constraint(&mats[0][i], &z);
            b[i] = evaluate_constraint(&mats[1][i], &z);
            c[i] = evaluate_constraint(&mats[2][i], &z);
        }
        a[m..m + num_inputs].copy_from_slice(&z[..num_inputs]);
        assert_eq!(want.len(), n);
        for run in 0..2 {
            let got = gpu_witness_map(&a, &b, &c);
            assert!(
                got == want,
                "witness map differs from ark-groth16: m = {m}, n = {n}, run {run}"
            );
        }
    }
}

#[test]
fn gpu_witness_map_large_random() {
    for log_n in [20u32, 22] {
        let n = 1usize << log_n;
        let (a, b, c) = (
            random_fr(n, seed(400)),
            random_fr(n, seed(401)),
            random_fr(n, seed(402)),
        );
        let want = witness_map_cpu(&a, &b, &c).expect("cpu reference");
        for run in 0..2 {
            assert!(
                gpu_witness_map(&a, &b, &c) == want,
                "witness map 2^{log_n} run {run}"
            );
        }
    }
}

#[test]
fn gpu_witness_map_rejects_mismatched_buffers() {
    let s = gpu().new_stream().expect("stream");
    let mut a = s.alloc_zeros::<DevFr>(8).expect("alloc");
    let mut b = s.alloc_zeros::<DevFr>(8).expect("alloc");
    let mut c = s.alloc_zeros::<DevFr>(4).expect("alloc");
    assert!(matches!(
        witness_map(gpu(), &s, &mut a, &mut b, &mut c),
        Err(CudaError::InvalidInput(_))
    ));
    gpu().sync(&s, "mismatch").expect("clean error state");
}

#[test]
fn gpu_bench_ntt_smoke() {
    let t = bench_ntt(gpu(), &[10, 16], 10).expect("bench");
    assert_eq!(t.len(), 2);
    for x in &t {
        assert!(
            x.median_ms > 0.0 && x.min_ms <= x.median_ms && x.median_ms <= x.max_ms,
            "{x:?}"
        );
        assert!(x.copy_gbps > 0.0 && x.fr_mul_per_s > 0.0, "{x:?}");
        assert!(x.scratch_median_ms > 0.0, "{x:?}");
    }
}
