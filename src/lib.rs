//! twolock: a correctness-first harness around a two-lock GPU Groth16 prover for BLS12-381.
//!
//! The prover is the subject, the harness the product. Layers, bottom up:
//! - [`circuits`]: the three test circuit families, satisfiable by construction;
//! - [`keys`]: real (cached) and synthetic proving keys, with validation;
//! - [`reference`](mod@reference): ark-groth16's prover with every intermediate exposed;
//! - [`device`]: the `Device` trait, the simulated GPU and (feature `cuda`) the CUDA GPU;
//! - [`prover`]: the two-lock pipeline, its timeline and the known-bad lock designs;
//! - [`stress`] and [`bench`](mod@bench): what the CLI's `stress` and `bench` commands run.

pub mod audit;
pub mod bench;
pub mod circuits;
pub mod device;
pub mod error;
pub mod golden;
pub mod keys;
#[cfg(feature = "peer-sppark")]
pub mod peer;
pub mod prover;
pub mod reference;
pub mod stress;
pub mod sync;
pub mod workload;

pub use error::Error;

/// The pairing engine every part of twolock works over.
pub type Curve = ark_bls12_381::Bls12_381;
/// The scalar field of BLS12-381.
pub type Fr = ark_bls12_381::Fr;
/// A Groth16 proving key over BLS12-381.
pub type ProvingKey = ark_groth16::ProvingKey<Curve>;
/// A Groth16 verifying key over BLS12-381.
pub type VerifyingKey = ark_groth16::VerifyingKey<Curve>;
/// A Groth16 proof over BLS12-381.
pub type Proof = ark_groth16::Proof<Curve>;
