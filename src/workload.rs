//! A workload: a circuit, its key, and a batch of partitions with their r and s, plus
//! the checks a harness applies to what a prover returns for it.

use ark_groth16::Groth16;
use ark_snark::SNARK;
use serde::Serialize;

use crate::circuits::{CircuitSpec, ConstraintMatrices};
use crate::keys::{self, KeyMaterial};
use crate::prover::{Batch, ProveError, RsSource};
use crate::sync::Arc;
use crate::{reference, Curve, Error, Fr, Proof};

/// Which key a workload proves under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum KeyChoice {
    /// ark-groth16 setup (cached on disk); up to 2^20 constraints
    /// ([`keys::MAX_REAL_LOG_CONSTRAINTS`]).
    Real { seed: u64 },
    /// Pseudo-random points; proofs are checked by equality with the reference prover.
    Synthetic { seed: u64 },
}

/// Loads a key file written by [`keys::save_key`], validating its lengths against the
/// circuit and every point (on the curve, in the subgroup): a file is untrusted input.
pub fn key_from_file(path: &std::path::Path, spec: &CircuitSpec) -> Result<KeyMaterial, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    let pk = keys::load_key(&bytes, spec, keys::Trust::Untrusted)?;
    Ok(KeyMaterial {
        pk,
        provenance: keys::Provenance::Real { key_seed: 0 },
        spec: *spec,
    })
}

/// Largest circuit for which [`KeyChoice::auto`] picks a real key: setup above it takes
/// longer than the proofs a user asked for.
pub const AUTO_REAL_LOG_CONSTRAINTS: u32 = 16;

impl KeyChoice {
    /// Real where setup is affordable, synthetic beyond.
    pub fn auto(spec: &CircuitSpec, seed: u64) -> Self {
        if spec.log_constraints <= AUTO_REAL_LOG_CONSTRAINTS {
            KeyChoice::Real { seed }
        } else {
            KeyChoice::Synthetic { seed }
        }
    }
}

pub struct Workload {
    pub spec: CircuitSpec,
    pub key: Arc<KeyMaterial>,
    pub matrices: Arc<ConstraintMatrices>,
    /// Full assignments, one per partition (witness seeds `witness_seed..`).
    pub assignments: Vec<Vec<Fr>>,
}

impl Workload {
    pub fn build(
        spec: CircuitSpec,
        key: KeyChoice,
        partitions: usize,
        witness_seed: u64,
    ) -> Result<Self, Error> {
        let key = match key {
            KeyChoice::Real { seed } => keys::real_key(&spec, seed)?,
            KeyChoice::Synthetic { seed } => keys::synthetic_key(&spec, seed)?,
        };
        Self::with_key(spec, key, partitions, witness_seed)
    }

    /// A workload under a key the caller already has (e.g. from [`key_from_file`]).
    pub fn with_key(
        spec: CircuitSpec,
        key: KeyMaterial,
        partitions: usize,
        witness_seed: u64,
    ) -> Result<Self, Error> {
        let matrices = spec.constraints()?;
        keys::check_lengths(&key.pk, &matrices)?;
        let assignments = (0..partitions as u64)
            .map(|i| spec.assignment(witness_seed.wrapping_add(i)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            spec,
            key: Arc::new(key),
            matrices: Arc::new(matrices),
            assignments,
        })
    }

    /// The same key and circuit with `n` partitions, reusing the witnesses cyclically
    /// (each partition still gets its own r and s from the batch).
    pub fn cycled(&self, n: usize) -> Workload {
        let len = self.assignments.len().max(1);
        Workload {
            spec: self.spec,
            key: self.key.clone(),
            matrices: self.matrices.clone(),
            assignments: (0..n)
                .filter_map(|i| self.assignments.get(i % len).cloned())
                .collect(),
        }
    }

    pub fn batch(&self, rs: &RsSource) -> Result<Arc<Batch>, ProveError> {
        Ok(Arc::new(Batch::new(
            Arc::new(self.key.pk.clone()),
            self.matrices.clone(),
            self.assignments.clone(),
            rs,
        )?))
    }

    /// Public inputs of partition `i` (without the constant one).
    pub fn public_inputs(&self, i: usize) -> &[Fr] {
        &self.assignments[i][1..self.matrices.num_instance_variables]
    }

    /// Checks one returned proof: a real key's proof must verify *and* equal the
    /// reference prover's for the same r, s; a synthetic key's must equal it.
    pub fn check(&self, batch: &Batch, i: usize, proof: &Proof) -> Result<Check, Error> {
        let (r, s) = batch.rs[i];
        let reference = reference::proof(&self.key.pk, &self.matrices, &self.assignments[i], r, s)?;
        if &reference != proof {
            return Ok(Check::Wrong);
        }
        if self.key.is_synthetic() {
            return Ok(Check::MatchesReference);
        }
        let pvk = Groth16::<Curve>::process_vk(&self.key.pk.vk)
            .map_err(|e| Error::Verify(e.to_string()))?;
        let ok = Groth16::<Curve>::verify_with_processed_vk(&pvk, self.public_inputs(i), proof)
            .map_err(|e| Error::Verify(e.to_string()))?;
        Ok(if ok { Check::Verified } else { Check::Wrong })
    }
}

/// The verdict on one proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// Equal to the reference proof and verified by ark-groth16.
    Verified,
    /// Equal to the reference proof (synthetic key: verification is meaningless).
    MatchesReference,
    /// Differs from the reference, or fails verification: the harness's alarm.
    Wrong,
}
