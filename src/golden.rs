//! Golden proofs: the cases snapshotted in `golden/` and the record each holds. The
//! reference prover, the SimDevice pipeline and the CUDA pipeline must all reproduce
//! these bytes.

use ark_serialize::CanonicalSerialize;
use serde::Serialize;

use crate::circuits::{CircuitSpec, Family};
use crate::prover::RsSource;
use crate::workload::{KeyChoice, Workload};
use crate::{Error, Fr, Proof};

/// Key seed of every golden case.
pub const KEY_SEED: u64 = 1;
/// r and s of golden proofs come from this seed.
pub const RS_SEED: u64 = 0x601d;

/// One golden case: family × log size × witness seed.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub family: Family,
    pub log_constraints: u32,
    pub witness_seed: u64,
}

impl Case {
    pub fn name(&self) -> String {
        format!(
            "{}_2e{}_seed{}",
            self.family.name(),
            self.log_constraints,
            self.witness_seed
        )
    }

    /// The single-partition workload of this case (real key, 2 public inputs).
    pub fn workload(&self) -> Result<Workload, Error> {
        let spec = CircuitSpec::new(self.family, self.log_constraints, 2)?;
        Workload::build(
            spec,
            KeyChoice::Real { seed: KEY_SEED },
            1,
            self.witness_seed,
        )
    }

    pub fn rs() -> RsSource {
        RsSource::Seeded(RS_SEED)
    }
}

/// Every family × {2^4, 2^8, 2^12} × two witness seeds.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for family in Family::ALL {
        for log_constraints in [4, 8, 12] {
            for witness_seed in [1, 2] {
                v.push(Case {
                    family,
                    log_constraints,
                    witness_seed,
                });
            }
        }
    }
    v
}

/// What a snapshot holds.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Record {
    pub circuit: String,
    /// Compressed proof, hex.
    pub proof: String,
    /// Public inputs (canonical little-endian, hex), without the constant one.
    pub public_inputs: Vec<String>,
    /// SHA-256 of the compressed verifying key.
    pub vk_digest: String,
}

pub fn proof_hex(p: &Proof) -> String {
    let mut bytes = Vec::new();
    // Serializing into a Vec cannot fail.
    let _ = p.serialize_compressed(&mut bytes);
    hex::encode(bytes)
}

fn fr_hex(x: &Fr) -> String {
    let mut bytes = Vec::new();
    let _ = x.serialize_compressed(&mut bytes);
    hex::encode(bytes)
}

pub fn record(case: &Case, w: &Workload, proof: &Proof) -> Record {
    Record {
        circuit: case.name(),
        proof: proof_hex(proof),
        public_inputs: w.public_inputs(0).iter().map(fr_hex).collect(),
        vk_digest: w.key.vk_digest(),
    }
}
