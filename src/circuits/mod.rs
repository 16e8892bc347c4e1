//! The three test circuit families, each satisfiable by construction.
//!
//! A [`CircuitSpec`] names a family, a size and a number of public inputs. From it come:
//! - [`CircuitSpec::constraints`]: the R1CS matrices, generated directly and in parallel
//!   (the fast path that the provers use);
//! - [`CircuitSpec::assignment`]: a full assignment `[1, inputs.., witness..]` for a seed;
//! - [`CircuitSpec::circuit`]: a [`ConstraintSynthesizer`] that writes the same circuit the
//!   natural way, through ark-relations. Setup runs on it, so the real key's QAP is the one
//!   the fast path's matrices describe; the tests hold the two byte-equal.
//!
//! Every family fills exactly `2^log - 1 - num_inputs` constraints, so that
//! `num_constraints + num_instance_variables == 2^log` and the QAP domain is exactly `2^log`.
//! Structure (round constants, wiring) derives from the spec alone; witness values from
//! a ChaCha20 RNG seeded with the witness seed.

mod boolean;
mod mimc;
mod sparse;

use crate::Fr;
use ark_ff::{BigInteger, Field, PrimeField};
use ark_relations::gr1cs::{
    ConstraintSynthesizer, ConstraintSystemRef, LinearCombination, Matrix, SynthesisError, Variable,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::fmt;

/// Smallest supported size, as `log2` of the QAP domain.
pub const MIN_LOG_CONSTRAINTS: u32 = 2;
/// Largest supported size, as `log2` of the QAP domain.
pub const MAX_LOG_CONSTRAINTS: u32 = 26;
/// Default average number of terms per row of A and B in the sparse family.
pub const DEFAULT_DENSITY: u32 = 3;
/// Largest accepted sparse density.
pub const MAX_DENSITY: u32 = 64;

/// Rows per unit of parallel work; also the unit of the per-chunk structure RNG streams.
pub(crate) const CHUNK_ROWS: usize = 1 << 12;

/// A circuit family.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
#[clap(rename_all = "kebab-case")]
pub enum Family {
    /// MiMC-style permutation chains `x -> (x + k_i)^5`: dense, full-width witness values.
    Mimc,
    /// Bits, XOR, AND and bit packing (range checks), like SHA-256 circuits: mostly 0/1 values.
    Boolean,
    /// Random sparse R1CS with controllable density and repeated variables in a row.
    Sparse,
}

impl Family {
    /// Every family, in a fixed order.
    pub const ALL: [Family; 3] = [Family::Mimc, Family::Boolean, Family::Sparse];

    /// The kebab-case name (as in the CLI and in serde).
    pub fn name(self) -> &'static str {
        match self {
            Family::Mimc => "mimc",
            Family::Boolean => "boolean",
            Family::Sparse => "sparse",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of circuit construction and witness checking.
#[derive(Debug, thiserror::Error)]
pub enum CircuitError {
    #[error("circuit size 2^{log_constraints} is out of range: log must be in {min}..={max}")]
    SizeOutOfRange {
        log_constraints: u32,
        min: u32,
        max: u32,
    },
    #[error("{num_inputs} public inputs do not fit this circuit size: at most {max}")]
    TooManyInputs { num_inputs: usize, max: usize },
    #[error("a circuit needs at least one public input")]
    NoInputs,
    #[error("sparse density {density} is out of range: must be in 1..={max}")]
    DensityOutOfRange { density: u32, max: u32 },
    #[error("assignment has {got} values, the circuit has {expected} variables")]
    WitnessLength { expected: usize, got: usize },
    #[error("assignment's first value (the constant one) is not 1")]
    ConstantNotOne,
    #[error("constraint {constraint} is not satisfied")]
    Unsatisfied { constraint: usize },
    #[error(
        "constraint {constraint} refers to variable {index}, beyond the {num_variables} variables"
    )]
    IndexOutOfRange {
        constraint: usize,
        index: usize,
        num_variables: usize,
    },
    #[error("constraint synthesis failed: {0}")]
    Synthesis(#[from] SynthesisError),
}

/// The sizes of a circuit, known from its spec without building it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Instance variables, the constant one included.
    pub num_instance_variables: usize,
    /// Witness (auxiliary) variables.
    pub num_witness_variables: usize,
    /// Rows of A, B and C.
    pub num_constraints: usize,
}

impl Shape {
    /// All variables: instance (with the one) and witness.
    pub fn num_variables(&self) -> usize {
        self.num_instance_variables + self.num_witness_variables
    }

    /// The QAP domain size ark-groth16 uses: `num_constraints + num_instance` rounded up.
    pub fn domain_size(&self) -> usize {
        (self.num_constraints + self.num_instance_variables).next_power_of_two()
    }
}

/// What a circuit is: family, size, public inputs and (sparse only) density.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CircuitSpec {
    pub family: Family,
    /// `log2` of the QAP domain size.
    pub log_constraints: u32,
    /// Public inputs, at least 1, not counting the constant one.
    pub num_inputs: usize,
    /// Sparse family: average terms per row of A and B. Ignored by the other families.
    #[serde(default = "default_density")]
    pub density: u32,
}

fn default_density() -> u32 {
    DEFAULT_DENSITY
}

impl CircuitSpec {
    /// A validated spec with the default density.
    pub fn new(
        family: Family,
        log_constraints: u32,
        num_inputs: usize,
    ) -> Result<Self, CircuitError> {
        let spec = Self {
            family,
            log_constraints,
            num_inputs,
            density: DEFAULT_DENSITY,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The same spec with another density (validated for every family).
    pub fn with_density(self, density: u32) -> Result<Self, CircuitError> {
        let spec = Self { density, ..self };
        spec.validate()?;
        Ok(spec)
    }

    /// The most public inputs a circuit of size `2^log_constraints` takes: `2^(log-1) - 1`,
    /// which leaves at least half the domain to the circuit's own constraints.
    pub fn max_inputs(log_constraints: u32) -> usize {
        let log = log_constraints.clamp(MIN_LOG_CONSTRAINTS, MAX_LOG_CONSTRAINTS);
        (1usize << (log - 1)) - 1
    }

    /// Checks every field (they are public, and specs are deserialized).
    pub fn validate(&self) -> Result<(), CircuitError> {
        if !(MIN_LOG_CONSTRAINTS..=MAX_LOG_CONSTRAINTS).contains(&self.log_constraints) {
            return Err(CircuitError::SizeOutOfRange {
                log_constraints: self.log_constraints,
                min: MIN_LOG_CONSTRAINTS,
                max: MAX_LOG_CONSTRAINTS,
            });
        }
        if self.num_inputs == 0 {
            return Err(CircuitError::NoInputs);
        }
        let max = Self::max_inputs(self.log_constraints);
        if self.num_inputs > max {
            return Err(CircuitError::TooManyInputs {
                num_inputs: self.num_inputs,
                max,
            });
        }
        if self.density == 0 || self.density > MAX_DENSITY {
            return Err(CircuitError::DensityOutOfRange {
                density: self.density,
                max: MAX_DENSITY,
            });
        }
        Ok(())
    }

    /// QAP domain size: exactly `2^log_constraints`.
    pub fn domain_size(&self) -> usize {
        1usize << self.log_constraints.min(MAX_LOG_CONSTRAINTS)
    }

    /// Variable and constraint counts, computed without building anything.
    pub fn shape(&self) -> Result<Shape, CircuitError> {
        self.validate()?;
        let num_instance_variables = 1 + self.num_inputs;
        let num_constraints = self.domain_size() - num_instance_variables;
        let num_witness_variables = match self.family {
            Family::Mimc => mimc::num_witness(self),
            Family::Boolean => boolean::num_witness(self),
            Family::Sparse => sparse::num_witness(self),
        };
        Ok(Shape {
            num_instance_variables,
            num_witness_variables,
            num_constraints,
        })
    }

    /// The constraint matrices, generated directly (no `ConstraintSystem`) and in parallel.
    pub fn constraints(&self) -> Result<ConstraintMatrices, CircuitError> {
        let shape = self.shape()?;
        let [a, b, c] = match self.family {
            Family::Mimc => mimc::matrices(self, &shape),
            Family::Boolean => boolean::matrices(self, &shape),
            Family::Sparse => sparse::matrices(self, &shape),
        };
        Ok(ConstraintMatrices {
            abc: vec![a, b, c],
            num_instance_variables: shape.num_instance_variables,
            num_witness_variables: shape.num_witness_variables,
            num_constraints: shape.num_constraints,
        })
    }

    /// A full assignment `[1, public inputs.., witness..]`, satisfying by construction.
    pub fn assignment(&self, witness_seed: u64) -> Result<Vec<Fr>, CircuitError> {
        let shape = self.shape()?;
        let z = match self.family {
            Family::Mimc => mimc::assignment(self, &shape, witness_seed),
            Family::Boolean => boolean::assignment(self, &shape, witness_seed),
            Family::Sparse => sparse::assignment(self, &shape, witness_seed),
        };
        debug_assert_eq!(z.len(), shape.num_variables());
        Ok(z)
    }

    /// The circuit as a [`ConstraintSynthesizer`]; `witness_seed: None` for setup.
    pub fn circuit(&self, witness_seed: Option<u64>) -> Circuit {
        Circuit {
            spec: *self,
            witness_seed,
        }
    }

    /// The seed every structural choice (constants, wiring) derives from.
    pub(crate) fn structure_seed(&self) -> u64 {
        let mut h = Sha256::new();
        h.update(b"twolock/circuits/structure/v1");
        h.update(self.family.name().as_bytes());
        h.update(self.log_constraints.to_le_bytes());
        h.update((self.num_inputs as u64).to_le_bytes());
        if self.family == Family::Sparse {
            h.update(self.density.to_le_bytes());
        }
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        u64::from_le_bytes(first)
    }
}

/// R1CS matrices with their variable counts, in ark-groth16's layout.
#[derive(Clone, Debug)]
pub struct ConstraintMatrices {
    /// `[A, B, C]`, held as the slice `create_proof_with_reduction_and_matrices` takes,
    /// so that a reference proof borrows them instead of copying.
    abc: Vec<Matrix<Fr>>,
    /// Instance variables, the constant one included.
    pub num_instance_variables: usize,
    pub num_witness_variables: usize,
    pub num_constraints: usize,
}

impl ConstraintMatrices {
    /// `[A, B, C]` as `create_proof_with_reduction_and_matrices` takes them.
    pub fn as_slice(&self) -> &[Matrix<Fr>] {
        &self.abc
    }

    pub fn a(&self) -> &Matrix<Fr> {
        &self.abc[0]
    }

    pub fn b(&self) -> &Matrix<Fr> {
        &self.abc[1]
    }

    pub fn c(&self) -> &Matrix<Fr> {
        &self.abc[2]
    }

    /// All variables: instance (with the one) and witness.
    pub fn num_variables(&self) -> usize {
        self.num_instance_variables + self.num_witness_variables
    }

    /// The counts as a [`Shape`].
    pub fn shape(&self) -> Shape {
        Shape {
            num_instance_variables: self.num_instance_variables,
            num_witness_variables: self.num_witness_variables,
            num_constraints: self.num_constraints,
        }
    }

    /// Checks `full_assignment` against every row, in parallel; reports the first failure.
    pub fn check(&self, full_assignment: &[Fr]) -> Result<(), CircuitError> {
        let z = full_assignment;
        let num_variables = self.num_variables();
        if z.len() != num_variables {
            return Err(CircuitError::WitnessLength {
                expected: num_variables,
                got: z.len(),
            });
        }
        if z[0] != Fr::ONE {
            return Err(CircuitError::ConstantNotOne);
        }
        // A row's value, or the first index beyond the assignment. Missing rows are empty.
        let eval = |m: &Matrix<Fr>, i: usize| -> Result<Fr, usize> {
            let row = m.get(i).map_or(&[][..], Vec::as_slice);
            row.iter()
                .map(|&(c, j)| z.get(j).map(|v| c * v).ok_or(j))
                .sum()
        };
        let error_at = |constraint: usize| match (
            eval(self.a(), constraint),
            eval(self.b(), constraint),
            eval(self.c(), constraint),
        ) {
            (Ok(a), Ok(b), Ok(c)) => {
                (a * b != c).then_some(CircuitError::Unsatisfied { constraint })
            }
            (Err(index), _, _) | (_, Err(index), _) | (_, _, Err(index)) => {
                Some(CircuitError::IndexOutOfRange {
                    constraint,
                    index,
                    num_variables,
                })
            }
        };
        let first = (0..self.num_constraints)
            .into_par_iter()
            .map(error_at)
            .find_first(Option::is_some);
        first.flatten().map_or(Ok(()), Err)
    }

    /// SHA-256 (hex) of the matrices and counts: a stable name for the circuit's structure.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"twolock/circuits/matrices/v1");
        for n in [
            self.num_instance_variables,
            self.num_witness_variables,
            self.num_constraints,
        ] {
            h.update((n as u64).to_le_bytes());
        }
        for m in &self.abc {
            h.update((m.len() as u64).to_le_bytes());
            let chunk_digests: Vec<[u8; 32]> = m
                .par_chunks(CHUNK_ROWS)
                .map(|rows| {
                    let mut h = Sha256::new();
                    for row in rows {
                        h.update((row.len() as u64).to_le_bytes());
                        for (coeff, index) in row {
                            h.update((*index as u64).to_le_bytes());
                            h.update(coeff.into_bigint().to_bytes_le());
                        }
                    }
                    h.finalize().into()
                })
                .collect();
            for d in chunk_digests {
                h.update(d);
            }
        }
        hex::encode(h.finalize())
    }
}

/// A spec as a [`ConstraintSynthesizer`], with or without a witness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Circuit {
    spec: CircuitSpec,
    witness_seed: Option<u64>,
}

impl Circuit {
    /// The spec this circuit synthesizes.
    pub fn spec(&self) -> &CircuitSpec {
        &self.spec
    }

    /// The witness seed; `None` in setup.
    pub fn witness_seed(&self) -> Option<u64> {
        self.witness_seed
    }
}

impl ConstraintSynthesizer<Fr> for Circuit {
    fn generate_constraints(self, cs: ConstraintSystemRef<Fr>) -> Result<(), SynthesisError> {
        let shape = self.spec.shape().map_err(|e| {
            tracing::error!(spec = ?self.spec, "cannot synthesize: {e}");
            SynthesisError::Unsatisfiable
        })?;
        match self.spec.family {
            Family::Mimc => mimc::synthesize(&self.spec, &shape, self.witness_seed, &cs),
            Family::Boolean => boolean::synthesize(&self.spec, &shape, self.witness_seed, &cs),
            Family::Sparse => sparse::synthesize(&self.spec, &shape, self.witness_seed, &cs),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers shared by the families.

/// One row of a matrix.
pub(crate) type Row = Vec<(Fr, usize)>;

/// The RNG of structure chunk `stream`: independent streams make the fast path parallel
/// and its output independent of the thread count.
pub(crate) fn chunk_rng(seed: u64, stream: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// The witness RNG: one sequential ChaCha20 stream per witness seed.
pub(crate) fn witness_rng(witness_seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(witness_seed)
}

/// Builds `[A, B, C]` of `num_constraints` rows, `fill(chunk, first_row, a, b, c)` writing
/// the rows of one chunk of [`CHUNK_ROWS`], chunks in parallel.
pub(crate) fn par_matrices<F>(num_constraints: usize, fill: F) -> [Matrix<Fr>; 3]
where
    F: Fn(usize, usize, &mut [Row], &mut [Row], &mut [Row]) + Sync,
{
    let mut a: Matrix<Fr> = vec![Vec::new(); num_constraints];
    let mut b: Matrix<Fr> = vec![Vec::new(); num_constraints];
    let mut c: Matrix<Fr> = vec![Vec::new(); num_constraints];
    a.par_chunks_mut(CHUNK_ROWS)
        .zip(b.par_chunks_mut(CHUNK_ROWS))
        .zip(c.par_chunks_mut(CHUNK_ROWS))
        .enumerate()
        .for_each(|(k, ((a, b), c))| fill(k, k * CHUNK_ROWS, a, b, c));
    [a, b, c]
}

/// Maps variable indices of the full assignment to ark-relations variables.
#[derive(Clone, Copy)]
pub(crate) struct VarMap {
    num_instance: usize,
}

impl VarMap {
    pub(crate) fn new(shape: &Shape) -> Self {
        Self {
            num_instance: shape.num_instance_variables,
        }
    }

    pub(crate) fn var(self, index: usize) -> Variable {
        match index {
            0 => Variable::One,
            i if i < self.num_instance => Variable::instance(i),
            i => Variable::witness(i - self.num_instance),
        }
    }

    /// The row as a linear combination, term for term (no merging, no reordering).
    pub(crate) fn lc(self, row: &[(Fr, usize)]) -> LinearCombination<Fr> {
        LinearCombination(row.iter().map(|&(c, i)| (c, self.var(i))).collect())
    }
}

/// Enforces one row triple through ark-relations.
pub(crate) fn enforce(
    cs: &ConstraintSystemRef<Fr>,
    map: VarMap,
    a: &[(Fr, usize)],
    b: &[(Fr, usize)],
    c: &[(Fr, usize)],
) -> Result<(), SynthesisError> {
    cs.enforce_r1cs_constraint(|| map.lc(a), || map.lc(b), || map.lc(c))
}

/// A value for a new variable, or `AssignmentMissing` in setup.
pub(crate) fn value(v: Option<Fr>) -> impl FnOnce() -> Result<Fr, SynthesisError> {
    move || v.ok_or(SynthesisError::AssignmentMissing)
}

/// Checks that allocation in `cs` produced the expected index (a guard on the layout).
pub(crate) fn expect_index(got: Variable, map: VarMap, index: usize) -> Result<(), SynthesisError> {
    if got == map.var(index) {
        Ok(())
    } else {
        tracing::error!(?got, index, "variable allocated out of layout order");
        Err(SynthesisError::Unsatisfiable)
    }
}
