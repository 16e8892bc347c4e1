//! Proving keys: real ones (ark-groth16 setup, cached on disk), synthetic ones (fast,
//! pseudo-random, for sizes where setup is too slow), and their validated loading.
//!
//! The byte format is ark-serialize's **uncompressed** layout of [`ProvingKey`] (so
//! `ProvingKey::deserialize_uncompressed` reads it too). Uncompressed points load without
//! square roots, which matters at 2^26. [`load_key`] parses it itself, so that a length
//! prefix is checked against the spec before anything is allocated, and a bad point is
//! reported by query and index.

use crate::circuits::{chunk_rng, CircuitError, CircuitSpec, ConstraintMatrices, Shape};
use crate::{Curve, Fr, ProvingKey, VerifyingKey};
use ark_bls12_381::{G1Affine, G2Affine};
use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, CurveGroup, PrimeGroup};
use ark_ff::UniformRand;
use ark_groth16::{r1cs_to_qap::LibsnarkReduction, Groth16};
use ark_serialize::{CanonicalDeserialize, CanonicalSerialize, Compress, Validate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};

/// Largest circuit (`log2` of the domain) for which [`real_key`] runs setup. At 2^20,
/// ark-groth16 setup takes about 20 s on 16 cores (about 2 minutes on 2); keys are
/// cached on disk. Defaults pick real keys only up to
/// [`crate::workload::AUTO_REAL_LOG_CONSTRAINTS`].
pub const MAX_REAL_LOG_CONSTRAINTS: u32 = 20;
/// Bytes of an uncompressed G1 point.
pub const G1_BYTES: usize = 96;
/// Bytes of an uncompressed G2 point.
pub const G2_BYTES: usize = 192;

/// Where a key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Provenance {
    /// ark-groth16 setup with a ChaCha20 RNG seeded by `key_seed`: proofs verify.
    Real { key_seed: u64 },
    /// Pseudo-random subgroup points of the right lengths: proofs do not verify.
    Synthetic { seed: u64 },
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provenance::Real { .. } => f.write_str("real"),
            Provenance::Synthetic { .. } => f.write_str("SYNTHETIC (does not verify)"),
        }
    }
}

/// A proving key with what it is for and where it came from.
#[derive(Clone)]
pub struct KeyMaterial {
    pub pk: ProvingKey,
    pub provenance: Provenance,
    pub spec: CircuitSpec,
}

impl KeyMaterial {
    /// Whether proofs under this key are meaningless (they cannot verify).
    pub fn is_synthetic(&self) -> bool {
        matches!(self.provenance, Provenance::Synthetic { .. })
    }

    /// SHA-256 (hex) of the compressed verifying key.
    pub fn vk_digest(&self) -> String {
        vk_digest(&self.pk.vk)
    }
}

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyMaterial")
            .field("spec", &self.spec)
            .field("provenance", &self.provenance)
            .field("a_query", &self.pk.a_query.len())
            .field("h_query", &self.pk.h_query.len())
            .field("l_query", &self.pk.l_query.len())
            .finish_non_exhaustive()
    }
}

/// SHA-256 (hex) of a compressed verifying key.
pub fn vk_digest(vk: &VerifyingKey) -> String {
    let mut bytes = Vec::with_capacity(vk.compressed_size());
    // Writing fixed-size encodings into a Vec cannot fail.
    if let Err(e) = vk.serialize_compressed(&mut bytes) {
        tracing::error!("serializing a verifying key failed: {e}");
    }
    hex::encode(Sha256::digest(&bytes))
}

/// Whether loaded points need checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Our own cache: lengths are checked, points are not.
    Trusted,
    /// Anything else: every point is checked on the curve and in the prime-order subgroup.
    Untrusted,
}

/// Errors of key generation, caching and loading.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key bytes end early: {context}")]
    Truncated { context: String },
    #[error("key bytes are corrupt: {reason}")]
    Corrupt { reason: String },
    #[error("{query}[{index}] is not on the curve")]
    PointNotOnCurve { query: &'static str, index: usize },
    #[error("{query}[{index}] is not in the prime-order subgroup")]
    NotInSubgroup { query: &'static str, index: usize },
    #[error("{query} has {got} points, the circuit needs {expected}")]
    LengthMismatch {
        query: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("real keys go up to 2^{max} (setup is too slow beyond); asked for 2^{log_constraints}: use a synthetic key")]
    SizeTooLargeForRealKey { log_constraints: u32, max: u32 },
    #[error("Groth16 setup failed: {0}")]
    Setup(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Circuit(#[from] CircuitError),
}

// ---------------------------------------------------------------------------------------
// Real keys.

/// The key cache: `$TWOLOCK_KEY_CACHE`, else `<temp dir>/twolock-keys`.
pub fn key_cache_dir() -> PathBuf {
    match std::env::var_os("TWOLOCK_KEY_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::env::temp_dir().join("twolock-keys"),
    }
}

/// The cache file of a real key: the spec, the seed and the matrices' digest (so a change
/// to a circuit never meets a stale key).
pub fn cached_key_path(
    dir: &Path,
    spec: &CircuitSpec,
    key_seed: u64,
    matrices: &ConstraintMatrices,
) -> PathBuf {
    let digest = matrices.digest();
    dir.join(format!(
        "{}-log{}-in{}-d{}-seed{}-{}.pk",
        spec.family,
        spec.log_constraints,
        spec.num_inputs,
        spec.density,
        key_seed,
        &digest[..16]
    ))
}

/// A real key from ark-groth16 setup on `spec.circuit(None)`, from or into [`key_cache_dir`].
pub fn real_key(spec: &CircuitSpec, key_seed: u64) -> Result<KeyMaterial, KeyError> {
    real_key_in(&key_cache_dir(), spec, key_seed)
}

/// [`real_key`] with an explicit cache directory.
pub fn real_key_in(
    cache_dir: &Path,
    spec: &CircuitSpec,
    key_seed: u64,
) -> Result<KeyMaterial, KeyError> {
    spec.validate()?;
    if spec.log_constraints > MAX_REAL_LOG_CONSTRAINTS {
        return Err(KeyError::SizeTooLargeForRealKey {
            log_constraints: spec.log_constraints,
            max: MAX_REAL_LOG_CONSTRAINTS,
        });
    }
    let matrices = spec.constraints()?;
    let path = cached_key_path(cache_dir, spec, key_seed, &matrices);
    let provenance = Provenance::Real { key_seed };
    match std::fs::read(&path) {
        Ok(bytes) => match load_key(&bytes, spec, Trust::Trusted) {
            Ok(pk) => {
                tracing::info!(path = %path.display(), "using cached key");
                return Ok(KeyMaterial {
                    pk,
                    provenance,
                    spec: *spec,
                });
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "discarding unreadable cached key: {e}")
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KeyError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    }
    tracing::info!(?spec, key_seed, "running Groth16 setup");
    let started = std::time::Instant::now();
    let mut rng = ChaCha20Rng::seed_from_u64(key_seed);
    let pk = Groth16::<Curve, LibsnarkReduction>::generate_random_parameters_with_reduction(
        spec.circuit(None),
        &mut rng,
    )
    .map_err(|e| KeyError::Setup(e.to_string()))?;
    check_lengths(&pk, &matrices)?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "setup done"
    );
    write_atomically(&path, &save_key(&pk))?;
    Ok(KeyMaterial {
        pk,
        provenance,
        spec: *spec,
    })
}

/// Writes through a unique temporary file and a rename, so concurrent test processes never
/// see a partial key (see `real_key_in`, which reads without locking).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), KeyError> {
    fn io(p: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
        move |source| KeyError::Io {
            path: p.display().to_string(),
            source,
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        KeyError::Io {
            path: path.display().to_string(),
            source,
        }
    })
}

// ---------------------------------------------------------------------------------------
// Synthetic keys.

/// Points per unit of parallel work in synthetic keys (one scalar multiplication each).
const WALK_CHUNK: usize = 1 << 14;
/// Distinct steps of the random walk.
const WALK_STEPS: usize = 16;

/// A synthetic key: pseudo-random subgroup points with the lengths of `spec`, deterministic
/// in `seed`. Proofs under it do not verify.
///
/// Each query is a random walk `P_i = P_{i-1} + D_j` over 16 random steps `D_j`,
/// restarted at a random multiple of the generator every 2^14 points; chunks run
/// in parallel, each normalized with one batch inversion. Sums of subgroup points stay in the
/// subgroup. Memory: the key itself plus one chunk per thread.
pub fn synthetic_key(spec: &CircuitSpec, seed: u64) -> Result<KeyMaterial, KeyError> {
    let shape = spec.shape()?;
    tracing::info!(?spec, seed, "generating synthetic key");
    let mut rng = chunk_rng(seed, u64::MAX);
    let g1 = |rng: &mut ChaCha20Rng| {
        (ark_bls12_381::G1Projective::generator() * Fr::rand(rng)).into_affine()
    };
    let g2 = |rng: &mut ChaCha20Rng| {
        (ark_bls12_381::G2Projective::generator() * Fr::rand(rng)).into_affine()
    };
    let n = shape.num_variables();
    let vk = VerifyingKey {
        alpha_g1: g1(&mut rng),
        beta_g2: g2(&mut rng),
        gamma_g2: g2(&mut rng),
        delta_g2: g2(&mut rng),
        gamma_abc_g1: random_walk(seed, 1, shape.num_instance_variables),
    };
    let pk = ProvingKey {
        vk,
        beta_g1: g1(&mut rng),
        delta_g1: g1(&mut rng),
        a_query: random_walk(seed, 2, n),
        b_g1_query: random_walk(seed, 3, n),
        b_g2_query: random_walk(seed, 4, n),
        h_query: random_walk(seed, 5, shape.domain_size() - 1),
        l_query: random_walk(seed, 6, shape.num_witness_variables),
    };
    Ok(KeyMaterial {
        pk,
        provenance: Provenance::Synthetic { seed },
        spec: *spec,
    })
}

/// `len` walk points of query `tag`; see [`synthetic_key`].
fn random_walk<P: SWCurveConfig<ScalarField = Fr>>(
    seed: u64,
    tag: u64,
    len: usize,
) -> Vec<Affine<P>> {
    let stream = |chunk: u64| (tag << 48) | chunk;
    let mut rng = chunk_rng(seed, stream((1 << 48) - 1));
    let steps: Vec<Affine<P>> = (0..WALK_STEPS)
        .map(|_| (Projective::<P>::generator() * Fr::rand(&mut rng)).into_affine())
        .collect();
    // Filled in parallel (first touch of the pages included), then overwritten chunk by chunk.
    let mut out = Vec::with_capacity(len);
    out.par_extend(rayon::iter::repeat_n(Affine::<P>::zero(), len));
    out.par_chunks_mut(WALK_CHUNK)
        .enumerate()
        .for_each(|(chunk, out)| {
            let mut rng = chunk_rng(seed, stream(chunk as u64));
            let mut p = Projective::<P>::generator() * Fr::rand(&mut rng);
            let walk: Vec<Projective<P>> = (0..out.len())
                .map(|_| {
                    p += &steps[rng.gen_range(0..WALK_STEPS)];
                    p
                })
                .collect();
            out.copy_from_slice(&Projective::normalize_batch(&walk));
        });
    out
}

// ---------------------------------------------------------------------------------------
// Lengths, saving and loading.

/// Checks every query length against the matrices (see [`check_shape`]).
pub fn check_lengths(pk: &ProvingKey, spec_matrices: &ConstraintMatrices) -> Result<(), KeyError> {
    check_shape(pk, &spec_matrices.shape())
}

/// The lengths ark-groth16 0.6's generator produces, in serialization order.
fn expected_lengths(shape: &Shape) -> [(&'static str, usize); 6] {
    let vars = shape.num_variables();
    [
        ("gamma_abc_g1", shape.num_instance_variables),
        ("a_query", vars),
        ("b_g1_query", vars),
        ("b_g2_query", vars),
        ("h_query", shape.domain_size() - 1),
        ("l_query", shape.num_witness_variables),
    ]
}

/// Checks query lengths: `a`, `b_g1`, `b_g2`: all variables; `h`: domain - 1; `l`: witness
/// variables; `gamma_abc`: instance variables (the one included).
pub fn check_shape(pk: &ProvingKey, shape: &Shape) -> Result<(), KeyError> {
    let got = [
        pk.vk.gamma_abc_g1.len(),
        pk.a_query.len(),
        pk.b_g1_query.len(),
        pk.b_g2_query.len(),
        pk.h_query.len(),
        pk.l_query.len(),
    ];
    for ((query, expected), got) in expected_lengths(shape).into_iter().zip(got) {
        if got != expected {
            return Err(KeyError::LengthMismatch {
                query,
                expected,
                got,
            });
        }
    }
    Ok(())
}

/// The key in ark-serialize's uncompressed layout (points written in parallel).
pub fn save_key(pk: &ProvingKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(pk.uncompressed_size());
    let vk = &pk.vk;
    write_points(&mut out, &[vk.alpha_g1], G1_BYTES);
    write_points(&mut out, &[vk.beta_g2, vk.gamma_g2, vk.delta_g2], G2_BYTES);
    write_vec(&mut out, &vk.gamma_abc_g1, G1_BYTES);
    write_points(&mut out, &[pk.beta_g1, pk.delta_g1], G1_BYTES);
    write_vec(&mut out, &pk.a_query, G1_BYTES);
    write_vec(&mut out, &pk.b_g1_query, G1_BYTES);
    write_vec(&mut out, &pk.b_g2_query, G2_BYTES);
    write_vec(&mut out, &pk.h_query, G1_BYTES);
    write_vec(&mut out, &pk.l_query, G1_BYTES);
    out
}

fn write_vec<P: CanonicalSerialize + Sync>(out: &mut Vec<u8>, points: &[P], size: usize) {
    out.extend_from_slice(&(points.len() as u64).to_le_bytes());
    write_points(out, points, size);
}

fn write_points<P: CanonicalSerialize + Sync>(out: &mut Vec<u8>, points: &[P], size: usize) {
    let start = out.len();
    out.resize(start + points.len() * size, 0);
    out[start..]
        .par_chunks_mut(size)
        .zip(points)
        .for_each(|(mut bytes, p)| {
            // Fixed-size encodings into exactly sized slices cannot fail.
            if let Err(e) = p.serialize_uncompressed(&mut bytes) {
                tracing::error!("serializing a point failed: {e}");
            }
        });
}

/// Parses `bytes` (the [`save_key`] layout), checking every length against `spec` before
/// reading the points and, when `Untrusted`, every point on the curve and in the subgroup.
pub fn load_key(bytes: &[u8], spec: &CircuitSpec, trust: Trust) -> Result<ProvingKey, KeyError> {
    let [gamma_abc, a, b_g1, b_g2, h, l] = expected_lengths(&spec.shape()?);
    let mut r = Reader { bytes, pos: 0 };
    let alpha_g1 = r.point::<G1Affine>("alpha_g1", G1_BYTES)?;
    let beta_g2 = r.point::<G2Affine>("beta_g2", G2_BYTES)?;
    let gamma_g2 = r.point::<G2Affine>("gamma_g2", G2_BYTES)?;
    let delta_g2 = r.point::<G2Affine>("delta_g2", G2_BYTES)?;
    let gamma_abc_g1 = r.vec::<G1Affine>(gamma_abc, G1_BYTES)?;
    let beta_g1 = r.point::<G1Affine>("beta_g1", G1_BYTES)?;
    let delta_g1 = r.point::<G1Affine>("delta_g1", G1_BYTES)?;
    let a_query = r.vec::<G1Affine>(a, G1_BYTES)?;
    let b_g1_query = r.vec::<G1Affine>(b_g1, G1_BYTES)?;
    let b_g2_query = r.vec::<G2Affine>(b_g2, G2_BYTES)?;
    let h_query = r.vec::<G1Affine>(h, G1_BYTES)?;
    let l_query = r.vec::<G1Affine>(l, G1_BYTES)?;
    let trailing = bytes.len() - r.pos;
    if trailing != 0 {
        return Err(KeyError::Corrupt {
            reason: format!("{trailing} bytes after the key"),
        });
    }
    let vk = VerifyingKey {
        alpha_g1,
        beta_g2,
        gamma_g2,
        delta_g2,
        gamma_abc_g1,
    };
    let pk = ProvingKey {
        vk,
        beta_g1,
        delta_g1,
        a_query,
        b_g1_query,
        b_g2_query,
        h_query,
        l_query,
    };
    if trust == Trust::Untrusted {
        validate_points(&pk)?;
    }
    Ok(pk)
}

/// Checks every point of `pk` on the curve and in the prime-order subgroup, in parallel;
/// reports the first bad point of the first bad query (serialization order).
pub fn validate_points(pk: &ProvingKey) -> Result<(), KeyError> {
    let vk = &pk.vk;
    validate("alpha_g1", &[vk.alpha_g1])?;
    validate("beta_g2", &[vk.beta_g2])?;
    validate("gamma_g2", &[vk.gamma_g2])?;
    validate("delta_g2", &[vk.delta_g2])?;
    validate("gamma_abc_g1", &vk.gamma_abc_g1)?;
    validate("beta_g1", &[pk.beta_g1])?;
    validate("delta_g1", &[pk.delta_g1])?;
    validate("a_query", &pk.a_query)?;
    validate("b_g1_query", &pk.b_g1_query)?;
    validate("b_g2_query", &pk.b_g2_query)?;
    validate("h_query", &pk.h_query)?;
    validate("l_query", &pk.l_query)
}

fn validate<P: SWCurveConfig>(query: &'static str, points: &[Affine<P>]) -> Result<(), KeyError> {
    let bad = points
        .par_iter()
        .position_first(|p| !p.is_on_curve() || !p.is_in_correct_subgroup_assuming_on_curve());
    match bad {
        None => Ok(()),
        Some(index) if !points[index].is_on_curve() => {
            Err(KeyError::PointNotOnCurve { query, index })
        }
        Some(index) => Err(KeyError::NotInSubgroup { query, index }),
    }
}

/// A cursor over key bytes that names what it was reading when they ran out.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], KeyError> {
        let left = self.bytes.len() - self.pos;
        if left < len {
            return Err(KeyError::Truncated {
                context: format!(
                    "{} needs {len} bytes at offset {}, {left} left",
                    what(),
                    self.pos
                ),
            });
        }
        let out = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    fn point<P: CanonicalDeserialize>(
        &mut self,
        query: &'static str,
        size: usize,
    ) -> Result<P, KeyError> {
        let bytes = self.take(size, || query.to_string())?;
        decode(bytes).map_err(|e| corrupt(query, 0, e))
    }

    /// A length-prefixed vector of `(query, expected)` points, decoded in parallel.
    fn vec<P: CanonicalDeserialize + Send>(
        &mut self,
        (query, expected): (&'static str, usize),
        size: usize,
    ) -> Result<Vec<P>, KeyError> {
        let prefix = self.take(8, || format!("{query} length"))?;
        let mut len = [0u8; 8];
        len.copy_from_slice(prefix);
        let got = u64::from_le_bytes(len);
        if got != expected as u64 {
            let got = usize::try_from(got).unwrap_or(usize::MAX);
            return Err(KeyError::LengthMismatch {
                query,
                expected,
                got,
            });
        }
        let total = expected
            .checked_mul(size)
            .ok_or_else(|| KeyError::Corrupt {
                reason: format!("{query}: {expected} points overflow the address space"),
            })?;
        let start = self.pos;
        let bytes = self
            .take(total, || format!("{query} ({expected} points)"))
            .map_err(|e| match e {
                KeyError::Truncated { context } => {
                    let whole = (self.bytes.len() - start) / size;
                    KeyError::Truncated {
                        context: format!("{context}: {query}[{whole}] is cut"),
                    }
                }
                e => e,
            })?;
        let points: Result<Vec<P>, _> = bytes.par_chunks_exact(size).map(decode).collect();
        points.map_err(|e| {
            // Failure path only: find the first bad index for the report.
            let index = bytes
                .par_chunks_exact(size)
                .position_first(|p| decode::<P>(p).is_err());
            corrupt(query, index.unwrap_or(0), e)
        })
    }
}

fn decode<P: CanonicalDeserialize>(bytes: &[u8]) -> Result<P, ark_serialize::SerializationError> {
    P::deserialize_with_mode(bytes, Compress::No, Validate::No)
}

fn corrupt(query: &str, index: usize, e: ark_serialize::SerializationError) -> KeyError {
    KeyError::Corrupt {
        reason: format!("{query}[{index}] does not decode: {e}"),
    }
}
