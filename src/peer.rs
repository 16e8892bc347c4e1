//! sppark (Supranational's CUDA library) as a benchmark peer (feature `peer-sppark`).
//!
//! `twolock bench msm` / `twolock bench ntt` report our kernels' time as a ratio against
//! sppark's MSM and NTT for BLS12-381, measured in the same run. The CUDA side is
//! `cuda/peer/sppark.cu`, compiled by `build.rs` with nvcc into a static library with the
//! CUDA runtime linked statically; this module converts arkworks values to sppark's
//! layouts on the host (before anything is timed), calls it, and converts back.
//!
//! Layouts (all limbs little-endian `u64`):
//! - bases: sppark's plain `Affine_t<fp_t>`, `x[6] ‖ y[6]` in Montgomery form with
//!   R = 2^384, which is what arkworks' `Fq` holds, so the limbs are copied as they
//!   are. sppark has no infinity flag in that type: the point at infinity is `(0, 0)`
//!   (not on the curve, since b = 4). arkworks' `G1Affine` is not `repr(C)` and carries
//!   a flag, so each point is rebuilt explicitly rather than cast.
//! - scalars: canonical integers (`Fr::into_bigint`), passed with sppark's
//!   `mont = false`, as sppark's own arkworks glue does.
//! - MSM result: sppark's `jacobian_t<fp_t>`, `X[6] ‖ Y[6] ‖ Z[6]` in Montgomery form,
//!   Jacobian (x = X/Z², y = Y/Z³) as arkworks' `G1Projective`; `Z = 0` is infinity.
//!   The coordinates are reduced (defensively) and the point is checked to be on the
//!   curve, else [`PeerError::BadOutput`].
//! - NTT values: `Fr` Montgomery limbs with R = 2^256, sppark's `fr_t` representation,
//!   copied as they are in both directions (outputs reduced defensively).
//!
//! The NTT is sppark's forward transform with natural order in and out (`NN`) over
//! `forward_roots_of_unity[log n]`, which equals arkworks' `Fr::get_root_of_unity(n)`
//! for every n = 2^k (checked against sppark 0.1.16's parameter table), so it computes
//! what `Radix2EvaluationDomain::<Fr>::new(n).fft(values)` computes.
//!
//! Calls are serialised by a process-wide lock: sppark's MSM keeps per-stream work
//! counters in device globals, so two concurrent MSMs would corrupt each other (and
//! concurrent runs would spoil each other's timings).

use std::ffi::{c_char, CStr};
use std::sync::Mutex;

use ark_bls12_381::{Fq, Fr, G1Affine, G1Projective};
use ark_ec::{AffineRepr, CurveGroup};
use ark_ff::{BigInt, BigInteger, PrimeField, Zero};

// The crates that provide the code the glue links against: sppark's GPU registry
// (`select_gpu` & co., built by its build script) and blst's field assembly (used by
// sppark's host-side field type).
use blst as _;
use sppark as _;

/// A peer measurement: the computed value, the median device time of `runs` timed runs
/// (after one untimed warm-up), and `runs`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerTiming<T> {
    pub value: T,
    pub median_ms: f64,
    pub runs: usize,
}

/// Why a peer call failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A failure inside sppark or the glue. `code > 0` is a `cudaError_t` (e.g. 100,
    /// `cudaErrorNoDevice`, on a machine without a GPU); `code < 0` is a failure that
    /// is not a CUDA error (-2: the glue refused its arguments, -3: a C++ exception
    /// such as a host allocation failure).
    #[error("sppark peer: CUDA error {code}: {msg}")]
    Cuda { code: i32, msg: String },
    /// The inputs were rejected before anything ran (empty, lengths differ, not a
    /// power of two, too large, `runs == 0`).
    #[error("sppark peer: invalid input: {0}")]
    InvalidInput(String),
    /// sppark returned something that is not a valid value (an MSM result off the
    /// curve): a layout mismatch or a device fault, never silently accepted.
    #[error("sppark peer: bad output: {0}")]
    BadOutput(String),
}

const MSG_LEN: usize = 512;

/// `struct twolock_peer_status` in `cuda/peer/sppark.cu`.
#[repr(C)]
struct Status {
    code: i32,
    msg: [c_char; MSG_LEN],
}

impl Status {
    fn new() -> Self {
        Status {
            code: 0,
            msg: [0; MSG_LEN],
        }
    }

    fn into_error(self, rc: i32) -> PeerError {
        // The glue always NUL-terminates; fall back to a fixed text if it did not.
        let bytes: Vec<u8> = self.msg.iter().map(|&c| c as u8).collect();
        let msg = CStr::from_bytes_until_nul(&bytes)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "no message".to_owned());
        let code = if self.code != 0 { self.code } else { rc };
        PeerError::Cuda { code, msg }
    }
}

/// sppark's `Affine_t<fp_t>` as the glue reads it.
type RawAffine = [u64; 12];
/// sppark's `fr_t` (as a canonical scalar or a Montgomery value).
type RawFr = [u64; 4];
/// sppark's `jacobian_t<fp_t>`.
type RawJacobian = [u64; 18];

extern "C" {
    fn twolock_sppark_msm_g1(
        bases: *const RawAffine,
        scalars: *const RawFr,
        npoints: usize,
        runs: u32,
        out: *mut RawJacobian,
        times_ms: *mut f32,
        status: *mut Status,
    ) -> i32;

    fn twolock_sppark_ntt_forward(
        inout: *mut RawFr,
        lg_n: u32,
        runs: u32,
        times_ms: *mut f32,
        status: *mut Status,
    ) -> i32;

    fn twolock_sppark_ntt_max_lg() -> u32;
}

/// Serialises every call into sppark (see the module docs).
static PEER_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    // A panic while holding the lock cannot leave sppark in a state the lock guards.
    PEER_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The largest NTT size sppark was compiled for, as log2 (28 for sppark 0.1.16).
pub fn sppark_ntt_max_log_size() -> u32 {
    // SAFETY: returns a compile-time constant; touches no state.
    unsafe { twolock_sppark_ntt_max_lg() }
}

/// The most timed runs one call takes (the per-run times are kept on the host).
pub const MAX_RUNS: usize = 1 << 20;

fn check_runs(runs: usize) -> Result<u32, PeerError> {
    if runs == 0 {
        return Err(PeerError::InvalidInput(
            "runs must be at least 1 (one warm-up run is added)".into(),
        ));
    }
    if runs > MAX_RUNS {
        return Err(PeerError::InvalidInput(format!(
            "runs = {runs} is above the limit of {MAX_RUNS}"
        )));
    }
    u32::try_from(runs).map_err(|_| PeerError::InvalidInput(format!("runs = {runs} is too large")))
}

/// Median of the per-run times (mean of the two middle ones for an even count).
fn median_ms(times: &[f32]) -> f64 {
    let mut t: Vec<f64> = times.iter().map(|&x| f64::from(x)).collect();
    t.sort_by(f64::total_cmp);
    let n = t.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        t[n / 2]
    } else {
        (t[n / 2 - 1] + t[n / 2]) / 2.0
    }
}

/// `v mod m` for a value below 2^(64·N), by repeated subtraction (the glue hands back
/// fully reduced values in practice; this only makes the decoding total).
fn reduce<const N: usize>(mut v: BigInt<N>, m: &BigInt<N>) -> BigInt<N> {
    while v >= *m {
        v.sub_with_borrow(m);
    }
    v
}

fn fq_from_mont(limbs: &[u64]) -> Fq {
    let mut a = [0u64; 6];
    a.copy_from_slice(limbs);
    Fq::new_unchecked(reduce(BigInt::new(a), &Fq::MODULUS))
}

fn fr_from_mont(limbs: RawFr) -> Fr {
    Fr::new_unchecked(reduce(BigInt::new(limbs), &Fr::MODULUS))
}

/// An arkworks base as sppark's `Affine_t`: Montgomery limbs, `(0, 0)` for infinity.
fn affine_to_raw(p: &G1Affine) -> RawAffine {
    let mut raw = [0u64; 12];
    if let Some((x, y)) = p.xy() {
        raw[..6].copy_from_slice(&x.0 .0);
        raw[6..].copy_from_slice(&y.0 .0);
    }
    raw
}

fn jacobian_from_raw(raw: &RawJacobian) -> Result<G1Projective, PeerError> {
    let z = fq_from_mont(&raw[12..18]);
    if z.is_zero() {
        return Ok(G1Projective::zero());
    }
    let x = fq_from_mont(&raw[0..6]);
    let y = fq_from_mont(&raw[6..12]);
    let p = G1Projective::new_unchecked(x, y, z);
    if !p.into_affine().is_on_curve() {
        return Err(PeerError::BadOutput(
            "sppark's MSM result is not on the curve".into(),
        ));
    }
    Ok(p)
}

/// sppark's G1 MSM, `Σ scalars[i]·bases[i]`.
///
/// The bases are uploaded once (sppark's `msm_t` constructed with the points); then
/// one warm-up and `runs` timed invocations take the scalars from host memory. Each
/// time is CUDA events bracketing sppark's synchronous `msm_t::invoke`, so it covers
/// the scalar upload, all kernels, the download of the window sums and sppark's
/// CPU-side final sum: the time until the result exists. `value` is the last run's.
/// Points at infinity among the bases are allowed.
pub fn sppark_msm_g1(
    bases: &[G1Affine],
    scalars: &[Fr],
    runs: usize,
) -> Result<PeerTiming<G1Projective>, PeerError> {
    if bases.is_empty() {
        return Err(PeerError::InvalidInput("MSM over no points".into()));
    }
    if bases.len() != scalars.len() {
        return Err(PeerError::InvalidInput(format!(
            "{} bases but {} scalars",
            bases.len(),
            scalars.len()
        )));
    }
    if bases.len() >= 1 << 31 {
        return Err(PeerError::InvalidInput(format!(
            "{} points; sppark's MSM takes fewer than 2^31",
            bases.len()
        )));
    }
    let runs_u32 = check_runs(runs)?;

    let raw_bases: Vec<RawAffine> = bases.iter().map(affine_to_raw).collect();
    let raw_scalars: Vec<RawFr> = scalars.iter().map(|s| s.into_bigint().0).collect();
    let mut out: RawJacobian = [0; 18];
    let mut times = vec![0f32; runs];
    let mut status = Status::new();

    let rc = {
        let _guard = lock();
        // SAFETY: every pointer is valid for the length the glue reads or writes:
        // `npoints` bases and scalars (their C++ sizes, 96 and 32 bytes, are asserted
        // there), one 144-byte result, `runs` floats and one status struct.
        unsafe {
            twolock_sppark_msm_g1(
                raw_bases.as_ptr(),
                raw_scalars.as_ptr(),
                raw_bases.len(),
                runs_u32,
                &mut out,
                times.as_mut_ptr(),
                &mut status,
            )
        }
    };
    if rc != 0 {
        return Err(status.into_error(rc));
    }
    Ok(PeerTiming {
        value: jacobian_from_raw(&out)?,
        median_ms: median_ms(&times),
        runs,
    })
}

/// sppark's forward NTT of `values` (natural order in and out), i.e. the evaluations
/// of the polynomial with coefficients `values` at the powers of
/// `Fr::get_root_of_unity(n)`, as ark-poly's `Radix2EvaluationDomain::fft`.
///
/// The input is uploaded once; each of one warm-up and `runs` timed runs restores it
/// with a device-to-device copy (not timed) and times only sppark's transform on the
/// device-resident data with CUDA events. `value` is the last run's output.
/// `values.len()` must be a power of two in `2..=2^sppark_ntt_max_log_size()`.
pub fn sppark_ntt_forward(values: &[Fr], runs: usize) -> Result<PeerTiming<Vec<Fr>>, PeerError> {
    let n = values.len();
    if n < 2 || !n.is_power_of_two() {
        return Err(PeerError::InvalidInput(format!(
            "NTT size {n} is not a power of two of at least 2"
        )));
    }
    let lg = n.trailing_zeros();
    let max_lg = sppark_ntt_max_log_size();
    if lg > max_lg {
        return Err(PeerError::InvalidInput(format!(
            "NTT size 2^{lg} is above sppark's 2^{max_lg}"
        )));
    }
    let runs_u32 = check_runs(runs)?;

    let mut data: Vec<RawFr> = values.iter().map(|v| v.0 .0).collect();
    let mut times = vec![0f32; runs];
    let mut status = Status::new();

    let rc = {
        let _guard = lock();
        // SAFETY: `data` holds 2^lg 32-byte values (fr_t's size is asserted in the
        // glue), `times` holds `runs` floats, `status` is one status struct.
        unsafe {
            twolock_sppark_ntt_forward(
                data.as_mut_ptr(),
                lg,
                runs_u32,
                times.as_mut_ptr(),
                &mut status,
            )
        }
    };
    if rc != 0 {
        return Err(status.into_error(rc));
    }
    Ok(PeerTiming {
        value: data.into_iter().map(fr_from_mont).collect(),
        median_ms: median_ms(&times),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ec::PrimeGroup;
    use ark_ff::{FftField, Field, MontFp, UniformRand};
    use rand::SeedableRng;

    #[test]
    fn median_odd_even() {
        assert_eq!(median_ms(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_ms(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median_ms(&[5.0]), 5.0);
    }

    #[test]
    fn affine_layout_roundtrip() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let p = G1Projective::rand(&mut rng).into_affine();
        let raw = affine_to_raw(&p);
        assert_eq!(fq_from_mont(&raw[..6]), p.x().unwrap());
        assert_eq!(fq_from_mont(&raw[6..]), p.y().unwrap());
        assert_eq!(affine_to_raw(&G1Affine::zero()), [0u64; 12]);
        // Montgomery form with R = 2^384: one is R mod p, sppark's BLS12_381_ONE.
        assert_eq!(
            Fq::ONE.0 .0,
            [
                0x760900000002fffd,
                0xebf4000bc40c0002,
                0x5f48985753c758ba,
                0x77ce585370525745,
                0x5c071a97a256ec6d,
                0x15f65ec3fa80e493
            ]
        );
        // And R = 2^256 for Fr: sppark's BLS12_381_rONE.
        assert_eq!(
            Fr::ONE.0 .0,
            [
                0x00000001fffffffe,
                0x5884b7fa00034802,
                0x998c4fefecbc4ff5,
                0x1824b159acc5056f
            ]
        );
    }

    #[test]
    fn jacobian_decoding() {
        let g = G1Projective::generator();
        let p = g * Fr::from(12345u64);
        // A Jacobian representative with Z != 1: (X·Z², Y·Z³, Z).
        let a = p.into_affine();
        let z: Fq = MontFp!("7");
        let (x, y) = a.xy().unwrap();
        let mut raw = [0u64; 18];
        raw[..6].copy_from_slice(&(x * z.square()).0 .0);
        raw[6..12].copy_from_slice(&(y * z.square() * z).0 .0);
        raw[12..].copy_from_slice(&z.0 .0);
        assert_eq!(jacobian_from_raw(&raw).unwrap(), p);
        // Z = 0 is infinity, whatever X and Y hold.
        let mut inf = raw;
        inf[12..].fill(0);
        assert!(jacobian_from_raw(&inf).unwrap().is_zero());
        // Off the curve is an error, not a value.
        let mut bad = raw;
        bad[0] ^= 1;
        assert!(matches!(
            jacobian_from_raw(&bad),
            Err(PeerError::BadOutput(_))
        ));
        // Unreduced limbs (value + modulus) decode to the same element.
        let mut unreduced = BigInt::new({
            let mut l = [0u64; 6];
            l.copy_from_slice(&raw[..6]);
            l
        });
        if !unreduced.add_with_carry(&Fq::MODULUS) {
            let mut r2 = raw;
            r2[..6].copy_from_slice(&unreduced.0);
            assert_eq!(jacobian_from_raw(&r2).unwrap(), p);
        }
    }

    #[test]
    fn scalars_are_canonical() {
        let s = Fr::from(5u64);
        assert_eq!(s.into_bigint().0, [5, 0, 0, 0]);
        assert_ne!(s.0 .0, [5, 0, 0, 0]);
    }

    #[test]
    fn invalid_inputs_are_typed() {
        let g = G1Affine::generator();
        assert!(matches!(
            sppark_msm_g1(&[], &[], 1),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_msm_g1(&[g, g], &[Fr::ONE], 1),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_msm_g1(&[g], &[Fr::ONE], 0),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_ntt_forward(&[], 1),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_ntt_forward(&[Fr::ONE], 1),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_ntt_forward(&[Fr::ONE; 3], 1),
            Err(PeerError::InvalidInput(_))
        ));
        assert!(matches!(
            sppark_ntt_forward(&[Fr::ONE; 4], 0),
            Err(PeerError::InvalidInput(_))
        ));
    }

    #[test]
    fn sppark_roots_are_arkworks_roots() {
        // sppark 0.1.16 ntt/parameters/bls12_381.h, forward_roots_of_unity[32]
        // (Montgomery limbs): arkworks' 2^32-th root; the table's other entries are
        // its squarings, as arkworks' get_root_of_unity(2^k).
        let sppark_root32 = Fr::new_unchecked(BigInt::new([
            0xb9b58d8c5f0e466a,
            0x5b1b4c801819d7ec,
            0x0af53ae352a31e64,
            0x5bf3adda19e9b27b,
        ]));
        assert_eq!(sppark_root32, Fr::TWO_ADIC_ROOT_OF_UNITY);
        // forward_roots_of_unity[10]
        let sppark_root10 = Fr::new_unchecked(BigInt::new([
            0xa4a6e37a36d7822a,
            0xfc83a2ce8787e5f1,
            0xe89553dae7ea8f80,
            0x6f6d38bb2a92ff1a,
        ]));
        assert_eq!(Some(sppark_root10), Fr::get_root_of_unity(1 << 10));
    }
}
