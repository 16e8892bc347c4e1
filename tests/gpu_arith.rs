//! Field and curve kernels against ark-ff / ark-ec, on random and edge values.
//!
//! GPU only: without a GPU every test fails (the CPU profile filters `gpu_*` out).
//! Every launch's output is poisoned first (an unwritten element decodes as `None`),
//! every call checks the CUDA error state on sync, and every batch runs twice on the
//! same inputs: a result that moves between runs is a race.
#![cfg(feature = "cuda")]

use std::sync::{Arc, OnceLock};

use ark_bls12_381::{Fq, Fq2, G1Affine, G1Projective};
use ark_ec::{AdditiveGroup, AffineRepr, CurveGroup};
use ark_ff::{BigInt, BigInteger, Field, One, PrimeField, UniformRand, Zero};
use cudarc::driver::CudaStream;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use twolock::device::cuda::arith::{self, FieldOp};
use twolock::device::cuda::layout::{
    fq2_from_dev, fq2_to_dev, fq_from_dev, fq_to_dev, fr_from_dev, fr_to_dev, g1_affine_from_dev,
    g1_affine_to_dev, projective_to_xyzz, xyzz_to_projective,
};
use twolock::device::cuda::{DevFr, DevG1Affine, DevG1Xyzz, Gpu};
use twolock::Fr;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => panic!("gpu_* tests need a CUDA GPU: {e}"),
    })
}

fn stream() -> Arc<CudaStream> {
    gpu().new_stream().expect("new stream")
}

/// Runs `f` twice and requires identical raw outputs.
fn twice<T: PartialEq + std::fmt::Debug>(what: &str, f: impl Fn() -> T) -> T {
    let first = f();
    let second = f();
    assert_eq!(
        first, second,
        "{what}: result moved between two identical runs (race?)"
    );
    first
}

// ---------- fields ----------

/// Fields with known stored-representation extremes.
trait Edges: PrimeField {
    /// The elements whose Montgomery limbs are 1 and p − 1.
    fn raw_extremes() -> Vec<Self>;
}

macro_rules! raw_extremes {
    ($f:ty) => {
        impl Edges for $f {
            fn raw_extremes() -> Vec<Self> {
                let mut pm1 = <$f>::MODULUS;
                pm1.0[0] -= 1; // the low limb of both moduli is odd: no borrow
                vec![
                    <$f>::new_unchecked(BigInt::from(1u64)),
                    <$f>::new_unchecked(pm1),
                ]
            }
        }
    };
}
raw_extremes!(Fr);
raw_extremes!(Fq);

/// Edge values: 0, 1, 2, −1, −2, (p−1)/2, (p+1)/2, and the raw-limb extremes.
fn edges<F: Edges>() -> Vec<F> {
    let mut m = F::MODULUS;
    m.div2();
    let half = F::from_bigint(m).expect("(p-1)/2 < p");
    let mut v = vec![
        F::zero(),
        F::one(),
        F::from(2u64),
        -F::one(),
        -F::from(2u64),
        half,
        half + F::one(),
    ];
    v.extend(F::raw_extremes());
    v
}

fn fr_vec(rng: &mut ChaCha20Rng, n: usize) -> Vec<Fr> {
    (0..n).map(|_| Fr::rand(rng)).collect()
}

/// Fq2 edge values: every (c0, c1) of two Fq edges, so 0, 1, −1, u, −u, −1 − u,
/// c0 = 0 or c1 = 0, c0 = ±c1, and the raw-limb extremes in either coordinate.
fn fq2_edges() -> Vec<Fq2> {
    let e = edges::<Fq>();
    e.iter()
        .flat_map(|&c0| e.iter().map(move |&c1| Fq2::new(c0, c1)))
        .collect()
}

/// A random Fq2 element, half of the time in one of the edges' special shapes:
/// c1 = 0, c0 = 0, c0 = c1 or c0 = −c1.
fn fq2_rand(rng: &mut ChaCha20Rng) -> Fq2 {
    let (x, y) = (Fq::rand(rng), Fq::rand(rng));
    match rng.gen_range(0..8) {
        0 => Fq2::new(x, Fq::zero()),
        1 => Fq2::new(Fq::zero(), x),
        2 => Fq2::new(x, x),
        3 => Fq2::new(x, -x),
        _ => Fq2::new(x, y),
    }
}

/// Operand pairs: every edge × edge, random × edge, random × random, and a == b.
fn pairs<F: Edges>(rng: &mut ChaCha20Rng, random: usize) -> (Vec<F>, Vec<F>) {
    pairs_of(&edges::<F>(), rng, random, F::rand)
}

/// [`pairs`] over the edges `e`, with random values drawn by `rand`.
fn pairs_of<F: Field>(
    e: &[F],
    rng: &mut ChaCha20Rng,
    random: usize,
    rand: impl Fn(&mut ChaCha20Rng) -> F,
) -> (Vec<F>, Vec<F>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in e {
        for y in e {
            a.push(*x);
            b.push(*y);
        }
    }
    for _ in 0..random {
        let (x, y) = (rand(rng), rand(rng));
        let z = e[rng.gen_range(0..e.len())];
        a.extend([x, x, z, x]);
        b.extend([y, x, x, z]);
    }
    (a, b)
}

fn expect_field<F: Field>(op: FieldOp, a: F, b: F) -> F {
    match op {
        FieldOp::Add => a + b,
        FieldOp::Sub => a - b,
        FieldOp::Neg => -a,
        FieldOp::Dbl => a.double(),
        FieldOp::Mul => a * b,
        FieldOp::Sqr => a.square(),
        FieldOp::Inverse => a.inverse().unwrap_or(F::zero()),
        FieldOp::Eq => {
            if a == b {
                F::one()
            } else {
                F::zero()
            }
        }
        FieldOp::IsZero => {
            if a.is_zero() {
                F::one()
            } else {
                F::zero()
            }
        }
    }
}

/// Every [`FieldOp`] on the device over operand pairs `(a, b)`, run twice, against
/// arkworks; `to_dev` / `from_dev` convert (decoding refuses unreduced limbs).
fn check_field<F: Field, D: arith::DeviceField + PartialEq + std::fmt::Debug>(
    label: &str,
    seed: u64,
    (a, b): (Vec<F>, Vec<F>),
    to_dev: impl Fn(&F) -> D,
    from_dev: impl Fn(&D) -> Option<F>,
) {
    let (da, db): (Vec<D>, Vec<D>) = (
        a.iter().map(&to_dev).collect(),
        b.iter().map(&to_dev).collect(),
    );
    let s = stream();
    for op in FieldOp::ALL {
        let out = twice(&format!("{label} {op:?}"), || {
            arith::field_op(gpu(), &s, op, &da, &db).expect("launch")
        });
        for i in 0..a.len() {
            let got = from_dev(&out[i]);
            let want = expect_field(op, a[i], b[i]);
            assert_eq!(
                got,
                Some(want),
                "{label} {op:?}({}, {}) seed {seed} index {i}",
                a[i],
                b[i]
            );
        }
    }
}

fn check_fr(seed: u64, random: usize) {
    let pairs = pairs::<Fr>(&mut ChaCha20Rng::seed_from_u64(seed), random);
    check_field("fr", seed, pairs, fr_to_dev, fr_from_dev);
}

fn check_fq(seed: u64, random: usize) {
    let pairs = pairs::<Fq>(&mut ChaCha20Rng::seed_from_u64(seed), random);
    check_field("fq", seed, pairs, fq_to_dev, fq_from_dev);
}

fn check_fq2(seed: u64, random: usize) {
    let pairs = pairs_of(
        &fq2_edges(),
        &mut ChaCha20Rng::seed_from_u64(seed),
        random,
        fq2_rand,
    );
    check_field("fq2", seed, pairs, fq2_to_dev, fq2_from_dev);
}

#[test]
fn gpu_field_edges_are_what_they_claim() {
    // A host-only guard of the edge list the GPU checks rely on (named gpu_ so it runs
    // with them).
    let e = Fr::raw_extremes();
    assert_eq!(e[0].0, BigInt::from(1u64));
    assert_eq!(e[1], -e[0]);
    let q = Fq::raw_extremes();
    assert_eq!(q[1], -q[0]);
    let e2 = fq2_edges();
    let u = Fq2::new(Fq::zero(), Fq::one());
    for x in [
        Fq2::zero(),
        Fq2::one(),
        -Fq2::one(),
        u,
        -u,
        -Fq2::one() - u,
        Fq2::new(q[1], q[1]),
    ] {
        assert!(e2.contains(&x), "{x} is not among the Fq2 edges");
    }
    // Zero has no inverse in arkworks, so expect_field wants 0, as fp2.cuh documents.
    assert_eq!(Fq2::zero().inverse(), None);
}

#[test]
fn gpu_fr_ops_edges_and_random() {
    check_fr(0xF0, 256);
}

#[test]
fn gpu_fq_ops_edges_and_random() {
    check_fq(0xF1, 256);
}

#[test]
fn gpu_fq2_ops_edges_and_random() {
    check_fq2(0xF2, 256);
}

#[test]
fn gpu_fr_batch_inverse() {
    let mut rng = ChaCha20Rng::seed_from_u64(0xB1);
    let mut a = fr_vec(&mut rng, 1000);
    for i in (0..a.len()).step_by(37) {
        a[i] = Fr::zero();
    }
    a.extend(edges::<Fr>());
    let da: Vec<DevFr> = a.iter().map(fr_to_dev).collect();
    let s = stream();
    for chunk in [1usize, 7, 32, 1000, 5000] {
        let out = twice("batch inverse", || {
            arith::fr_batch_inverse(gpu(), &s, &da, chunk).expect("launch")
        });
        for (i, x) in a.iter().enumerate() {
            assert_eq!(
                fr_from_dev(&out[i]),
                Some(x.inverse().unwrap_or(Fr::zero())),
                "chunk {chunk} index {i}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]
    #[test]
    fn gpu_fr_ops_proptest(seed in any::<u64>()) {
        check_fr(seed, 64);
    }
    #[test]
    fn gpu_fq_ops_proptest(seed in any::<u64>()) {
        check_fq(seed, 64);
    }
    #[test]
    fn gpu_fq2_ops_proptest(seed in any::<u64>()) {
        check_fq2(seed, 64);
    }
    #[test]
    fn gpu_g1_ops_proptest(seed in any::<u64>()) {
        check_g1(seed, 16);
    }
}

// ---------- G1 ----------

/// A projective point with a random, non-trivial Z (same point, other representation).
fn rescale(p: &G1Projective, rng: &mut ChaCha20Rng) -> G1Projective {
    if p.is_zero() {
        return *p;
    }
    let s = Fq::rand(rng);
    G1Projective::new_unchecked(p.x * s.square(), p.y * s.square() * s, p.z * s)
}

/// Point pairs covering every exceptional case: random, P + P (same and different
/// representation), P + (−P), ∞ on either side, ∞ + ∞, P + 2P, and duplicates.
fn point_pairs(rng: &mut ChaCha20Rng, random: usize) -> Vec<(G1Projective, G1Projective)> {
    let g = G1Projective::from(G1Affine::generator());
    let inf = G1Projective::zero();
    let mut v = vec![
        (inf, inf),
        (g, inf),
        (inf, g),
        (g, g),
        (g, -g),
        (g, g.double()),
    ];
    for _ in 0..random {
        let p = rescale(&G1Projective::rand(rng), rng);
        let q = rescale(&G1Projective::rand(rng), rng);
        let p2 = rescale(&p, rng);
        v.extend([
            (p, q),
            (p, p),
            (p, p2),
            (p, -p2),
            (p, inf),
            (inf, q),
            (p, p.double()),
            (-p, rescale(&p, rng)),
        ]);
    }
    v
}

fn xyzz_out(label: &str, d: &DevG1Xyzz) -> G1Projective {
    let p =
        xyzz_to_projective(d).unwrap_or_else(|| panic!("{label}: unreduced/poisoned output {d:?}"));
    assert!(p.into_affine().is_on_curve(), "{label}: off-curve result");
    p
}

fn check_g1(seed: u64, random: usize) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let pairs = point_pairs(&mut rng, random);
    let p: Vec<DevG1Xyzz> = pairs.iter().map(|(p, _)| projective_to_xyzz(p)).collect();
    let q: Vec<DevG1Xyzz> = pairs.iter().map(|(_, q)| projective_to_xyzz(q)).collect();
    let qa: Vec<DevG1Affine> = pairs
        .iter()
        .map(|(_, q)| g1_affine_to_dev(&q.into_affine()))
        .collect();
    let pa: Vec<DevG1Affine> = pairs
        .iter()
        .map(|(p, _)| g1_affine_to_dev(&p.into_affine()))
        .collect();
    let (gpu, s) = (gpu(), stream());

    let add = twice("g1_add", || arith::g1_add(gpu, &s, &p, &q).expect("launch"));
    let madd = twice("g1_add_affine", || {
        arith::g1_add_affine(gpu, &s, &p, &qa).expect("launch")
    });
    let msub = twice("g1_sub_affine", || {
        arith::g1_sub_affine(gpu, &s, &p, &qa).expect("launch")
    });
    let dbl = twice("g1_dbl", || arith::g1_dbl(gpu, &s, &p).expect("launch"));
    let dbla = twice("g1_dbl_affine", || {
        arith::g1_dbl_affine(gpu, &s, &pa).expect("launch")
    });
    let neg = twice("g1_neg", || arith::g1_neg(gpu, &s, &p).expect("launch"));
    let nega = twice("g1_affine_neg", || {
        arith::g1_affine_neg(gpu, &s, &pa).expect("launch")
    });
    let to_xyzz = twice("g1_affine_to_xyzz", || {
        arith::g1_affine_to_xyzz(gpu, &s, &pa).expect("launch")
    });
    let to_aff = twice("g1_xyzz_to_affine", || {
        arith::g1_xyzz_to_affine(gpu, &s, &p).expect("launch")
    });

    for (i, (pp, qq)) in pairs.iter().enumerate() {
        let l = |op: &str| format!("{op} pair {i} seed {seed}");
        assert_eq!(xyzz_out(&l("add"), &add[i]), *pp + qq, "{}", l("add"));
        assert_eq!(
            xyzz_out(&l("add_affine"), &madd[i]),
            *pp + qq,
            "{}",
            l("add_affine")
        );
        assert_eq!(
            xyzz_out(&l("sub_affine"), &msub[i]),
            *pp - qq,
            "{}",
            l("sub_affine")
        );
        assert_eq!(xyzz_out(&l("dbl"), &dbl[i]), pp.double(), "{}", l("dbl"));
        assert_eq!(
            xyzz_out(&l("dbl_affine"), &dbla[i]),
            pp.double(),
            "{}",
            l("dbl_affine")
        );
        assert_eq!(xyzz_out(&l("neg"), &neg[i]), -*pp, "{}", l("neg"));
        assert_eq!(
            g1_affine_from_dev(&nega[i]),
            Some((-*pp).into_affine()),
            "{}",
            l("affine_neg")
        );
        assert_eq!(
            xyzz_out(&l("to_xyzz"), &to_xyzz[i]),
            *pp,
            "{}",
            l("to_xyzz")
        );
        assert_eq!(
            g1_affine_from_dev(&to_aff[i]),
            Some(pp.into_affine()),
            "{}",
            l("to_affine")
        );
        // Infinity keeps its encodings: affine (0, 0), XYZZ ZZ = 0.
        if pp.is_zero() {
            assert_eq!(
                nega[i],
                DevG1Affine::default(),
                "{}",
                l("affine_neg of infinity")
            );
            assert_eq!(
                to_aff[i],
                DevG1Affine::default(),
                "{}",
                l("to_affine of infinity")
            );
        }
    }
}

#[test]
fn gpu_g1_ops_exceptional_cases() {
    check_g1(0x61, 64);
}

#[test]
fn gpu_no_sticky_error_after_all() {
    check_fr(0xE0, 8);
    gpu()
        .sync(gpu().default_stream(), "final check")
        .expect("CUDA error state is clean");
}

#[test]
fn gpu_module_cache_loads_once_under_contention() {
    let g = gpu();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| g.module(arith::MODULE).expect("load")))
            .collect();
        let mods: Vec<_> = hs.into_iter().map(|h| h.join().expect("thread")).collect();
        for m in &mods[1..] {
            assert!(Arc::ptr_eq(&mods[0], m), "module loaded more than once");
        }
    });
    assert!(matches!(
        g.function(arith::MODULE, "no_such_kernel"),
        Err(twolock::device::cuda::CudaError::MissingKernel { .. })
    ));
}

// ---------- host→device staging ----------

/// A value per (thread, index) that no other position shares.
fn pattern(thread: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(0x9E37_79B9) ^ thread.wrapping_mul(0x85EB_CA6B) ^ 0x5bd1_e995)
        .collect()
}

/// Uploads through the page-locked staging pool land intact at every size (one value,
/// a chunk's edge, several chunks with a ragged tail), the source is free as soon as the
/// call returns (it is overwritten at once), and the bytes went through the pool.
/// Concurrent uploads from 4 threads, more than the pool holds, land intact too.
#[test]
fn gpu_staged_uploads_land_intact() {
    use twolock::device::cuda::staging::{CHUNK, MAX_BUFFERS, PAGEABLE_ENV};
    use twolock::device::cuda::AllocKind;
    let g = gpu();
    let pageable = std::env::var(PAGEABLE_ENV).is_ok_and(|v| v == "1");
    let words = CHUNK / 4;
    for (i, n) in [1, 7, words - 1, words, words + 1, 3 * words + 5]
        .into_iter()
        .enumerate()
    {
        let s = stream();
        let mut buf = g
            .alloc::<u32>(&s, n, AllocKind::StreamOrdered)
            .expect("alloc");
        g.poison(&s, &mut buf).expect("poison");
        let want = pattern(i as u32, n);
        let mut src = want.clone();
        let before = g.staging_counts();
        g.upload_to(&s, &mut buf, &src).expect("upload");
        src.fill(0); // the copy must not read the source after the call
        let got = s.clone_dtoh(&buf).expect("download");
        g.sync(&s, "staged upload").expect("sync");
        assert!(got == want, "n = {n}: the device holds other values");
        let after = g.staging_counts();
        let bytes = 4 * n as u64;
        if pageable {
            assert_eq!(after.pageable - before.pageable, bytes, "n = {n}");
        } else {
            assert_eq!(after.staged - before.staged, bytes, "n = {n}: not staged");
        }
        buf.free().expect("free");
    }
    // Too many values for the buffer: a typed error, nothing copied.
    let s = stream();
    let mut small = g.alloc::<u32>(&s, 4, AllocKind::Sync).expect("alloc");
    assert!(matches!(
        g.upload_to(&s, &mut small, &[0u32; 5]),
        Err(twolock::device::cuda::CudaError::InvalidInput(_))
    ));
    small.free().expect("free");

    // 4 threads × 10 chunks > MAX_BUFFERS: some chunks may take the pageable path.
    let per = 10 * words + 3;
    assert!(4 * per > MAX_BUFFERS * words);
    let before = g.staging_counts();
    std::thread::scope(|sc| {
        for t in 0..4u32 {
            sc.spawn(move || {
                let s = stream();
                let want = pattern(100 + t, per);
                let mut buf = g
                    .alloc::<u32>(&s, per, AllocKind::StreamOrdered)
                    .expect("alloc");
                g.poison(&s, &mut buf).expect("poison");
                g.upload_to(&s, &mut buf, &want).expect("upload");
                let got = s.clone_dtoh(&buf).expect("download");
                g.sync(&s, "concurrent staged upload").expect("sync");
                assert!(got == want, "thread {t}: the device holds other values");
                buf.free().expect("free");
            });
        }
    });
    let after = g.staging_counts();
    let moved = (after.staged - before.staged) + (after.pageable - before.pageable);
    assert_eq!(moved, 4 * 4 * per as u64, "bytes counted");
    assert!(pageable || after.staged > before.staged, "nothing staged");
}

/// `reserve` pins buffers ahead of any upload, up to the bytes asked (rounded up to
/// whole chunks) and never past MAX_BUFFERS; a second reserve adds none; an upload of
/// the reserved size then goes wholly through them and lands intact.
#[test]
fn gpu_staging_reserve_pins_ahead() {
    use twolock::device::cuda::staging::{CHUNK, MAX_BUFFERS, PAGEABLE_ENV};
    use twolock::device::cuda::AllocKind;
    assert!(
        std::env::var(PAGEABLE_ENV).is_err(),
        "{PAGEABLE_ENV} is set: this test checks the staged path"
    );
    // A Gpu of its own: a fresh, empty pool whatever other tests in this process did.
    let g = Gpu::new(0).expect("a CUDA GPU");
    let chunk = CHUNK as u64;
    assert_eq!(g.reserve_staging(0).expect("reserve"), 0);
    assert_eq!(g.reserve_staging(3 * chunk - 1).expect("reserve"), 3);
    assert_eq!(
        g.reserve_staging(3 * chunk).expect("reserve"),
        0,
        "already held"
    );
    assert_eq!(
        g.reserve_staging(u64::MAX).expect("reserve"),
        MAX_BUFFERS - 3
    );
    assert_eq!(
        g.reserve_staging(u64::MAX).expect("reserve"),
        0,
        "at the cap"
    );

    let s = g.new_stream().expect("stream");
    let want = pattern(9, 3 * CHUNK / 4 + 11);
    let mut buf = g
        .alloc::<u32>(&s, want.len(), AllocKind::StreamOrdered)
        .expect("alloc");
    g.poison(&s, &mut buf).expect("poison");
    let before = g.staging_counts();
    g.upload_to(&s, &mut buf, &want).expect("upload");
    let after = g.staging_counts();
    let got = s.clone_dtoh(&buf).expect("download");
    g.sync(&s, "reserved upload").expect("sync");
    assert!(got == want, "the device holds other values");
    assert_eq!(
        after.staged - before.staged,
        4 * want.len() as u64,
        "not all staged"
    );
    assert_eq!(after.pageable, before.pageable, "a chunk went pageable");
    buf.free().expect("free");
}

/// Memory lent to the prep goes to the device in one async copy, counted as lent (not
/// staged or pageable); a write through `frs_mut` right after the upload waits for the
/// copy, so the device holds the values from before the write, held up behind a long
/// kernel to make the race real. Too many values for the buffer is a typed error.
#[test]
fn gpu_lent_memory_uploads_without_a_host_copy() {
    use std::time::Duration;
    use twolock::device::cuda::AllocKind;
    use twolock::device::host::LentMemory;
    let g = gpu();
    let s = stream();
    let n = 3 * (1 << 20) + 5;
    let mut lent = g.lend_pinned(n).expect("lend");
    assert!(
        lent.frs().iter().all(|v| v.is_zero()),
        "lent memory not zeroed"
    );
    let mut rng = ChaCha20Rng::seed_from_u64(41);
    let want: Vec<Fr> = (0..n).map(|_| Fr::rand(&mut rng)).collect();
    lent.frs_mut().expect("writable").copy_from_slice(&want);

    let mut buf = g
        .alloc::<DevFr>(&s, n, AllocKind::StreamOrdered)
        .expect("alloc");
    g.poison(&s, &mut buf).expect("poison");
    // The copy queues behind ~0.5 s of kernel work on the same stream.
    let rate = arith::fr_mul_rate(g, &s, 3).expect("rate probe");
    let threads = f64::from(g.sm_count().expect("SMs")) * 2048.0;
    let iters = (Duration::from_millis(500).as_secs_f64() * rate / (2.0 * threads)).ceil() as u32;
    let busy = arith::hold_stream(g, &s, iters).expect("hold the stream");
    let before = g.staging_counts();
    g.upload_lent(&s, &mut buf, &lent).expect("upload");
    let after = g.staging_counts();
    lent.frs_mut()
        .expect("wait for the copy")
        .fill(Fr::from(0u64));
    let got = s.clone_dtoh(&buf).expect("download");
    g.sync(&s, "lent upload").expect("sync");
    drop(busy);
    assert!(
        got.iter().map(fr_from_dev).collect::<Option<Vec<_>>>() == Some(want),
        "the device holds other values: the write did not wait for the copy"
    );
    assert_eq!(
        after.lent - before.lent,
        32 * n as u64,
        "not counted as lent"
    );
    assert_eq!(
        (after.staged, after.pageable),
        (before.staged, before.pageable)
    );

    let mut small = g.alloc::<DevFr>(&s, 4, AllocKind::Sync).expect("alloc");
    assert!(matches!(
        g.upload_lent(&s, &mut small, &lent),
        Err(twolock::device::cuda::CudaError::InvalidInput(_))
    ));
    small.free().expect("free");
    buf.free().expect("free");
}

/// The pool never waits on another stream: with every buffer in flight behind a long
/// kernel on one stream, an upload on a second stream takes the pageable path at once
/// (it returns while the first stream is still held) and lands intact, as do the held
/// stream's chunks once the kernel ends. This is the property the mem lock relies on:
/// an upload under mem must not wait for the compute holder's kernels.
#[test]
fn gpu_staging_never_waits_on_another_stream() {
    use std::time::{Duration, Instant};
    use twolock::device::cuda::staging::{CHUNK, MAX_BUFFERS, PAGEABLE_ENV};
    use twolock::device::cuda::AllocKind;
    assert!(
        std::env::var(PAGEABLE_ENV).is_err(),
        "{PAGEABLE_ENV} is set: this test checks the staged path"
    );
    let g = gpu();
    let (held, other) = (stream(), stream());
    // Products per second, then rounds for a hold of about 1.5 s.
    let rate = arith::fr_mul_rate(g, &held, 3).expect("rate probe");
    let threads = f64::from(g.sm_count().expect("SMs")) * 2048.0;
    let hold = Duration::from_millis(1500);
    let iters = (hold.as_secs_f64() * rate / (2.0 * threads)).ceil() as u32;

    let words = CHUNK / 4;
    let want_held = pattern(7, MAX_BUFFERS * words);
    let want_other = pattern(8, words + 9);
    let mut buf_held = g
        .alloc::<u32>(&held, want_held.len(), AllocKind::StreamOrdered)
        .expect("alloc");
    let mut buf_other = g
        .alloc::<u32>(&other, want_other.len(), AllocKind::StreamOrdered)
        .expect("alloc");
    g.poison(&held, &mut buf_held).expect("poison");
    g.poison(&other, &mut buf_other).expect("poison");
    g.sync(&held, "setup").expect("sync");
    g.sync(&other, "setup").expect("sync");

    let before = g.staging_counts();
    let started = Instant::now();
    let busy = arith::hold_stream(g, &held, iters).expect("hold the stream");
    // Every buffer goes in flight behind the kernel (none can finish before it).
    g.upload_to(&held, &mut buf_held, &want_held)
        .expect("upload behind the kernel");
    let mid = g.staging_counts();
    assert_eq!(
        mid.staged - before.staged,
        (MAX_BUFFERS * CHUNK) as u64,
        "the held stream's chunks were not all staged"
    );
    let t = Instant::now();
    g.upload_to(&other, &mut buf_other, &want_other)
        .expect("upload on the other stream");
    let took = t.elapsed();
    let done = started.elapsed();
    let probe = g.context().new_event(None).expect("event");
    probe.record(&held).expect("record");
    assert!(
        !probe.is_complete(),
        "the held stream finished before the check ({done:?} after the kernel's launch): \
         the hold was too short, or an upload waited for it (a page-locked allocation \
         that synchronizes?)"
    );
    assert!(
        took < Duration::from_millis(500),
        "the upload on the other stream took {took:?}: it waited for the held stream"
    );
    let after = g.staging_counts();
    assert_eq!(after.staged, mid.staged, "a buffer in flight was taken");
    assert_eq!(
        after.pageable - mid.pageable,
        4 * want_other.len() as u64,
        "the overflow did not go pageable"
    );

    let got_other = other.clone_dtoh(&buf_other).expect("download");
    g.sync(&other, "other stream").expect("sync");
    assert!(
        got_other == want_other,
        "the pageable overflow landed wrong"
    );
    let got_held = held.clone_dtoh(&buf_held).expect("download");
    g.sync(&held, "held stream").expect("sync");
    assert!(got_held == want_held, "the staged chunks landed wrong");
    drop(busy);
    buf_held.free().expect("free");
    buf_other.free().expect("free");
}
