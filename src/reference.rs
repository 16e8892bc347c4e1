//! The reference prover: ark-groth16's `create_proof_with_reduction_and_matrices`
//! (LibsnarkReduction) with explicit r and s, plus every intermediate a GPU stage must
//! reproduce, so a mismatch is pinned to a stage and not only seen in the final proof.

use ark_ec::{CurveGroup, VariableBaseMSM};
use ark_ff::{FftField, Field, PrimeField, Zero};
use ark_groth16::r1cs_to_qap::{evaluate_constraint, LibsnarkReduction, R1CSToQAP};
use ark_groth16::Groth16;
use ark_poly::{EvaluationDomain, GeneralEvaluationDomain, Radix2EvaluationDomain};
use thiserror::Error;

use crate::circuits::ConstraintMatrices;
use crate::{Curve, Fr, Proof, ProvingKey};

type G1 = ark_bls12_381::G1Projective;
type G2 = ark_bls12_381::G2Projective;

#[derive(Debug, Error)]
pub enum ReferenceError {
    #[error("witness has {got} values, the circuit needs {expected}")]
    WitnessLength { expected: usize, got: usize },
    #[error("domain of size {size} is not supported by BLS12-381's 2-adicity (max 2^32)")]
    DomainTooLarge { size: usize },
    #[error("ark-groth16 failed: {0}")]
    Groth16(#[from] ark_relations::gr1cs::SynthesisError),
}

/// The MSM results of one proof, before the r/s blinding is folded in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsmResults {
    /// Σ h_i · h_query_i
    pub h: G1,
    /// Σ aux_i · l_query_i
    pub l: G1,
    /// Σ z_i · a_query_{i} over `z = inputs[1..] ++ aux` (`query[0]` excluded, as ark-groth16)
    pub a: G1,
    /// Same for b_g1_query.
    pub b_g1: G1,
    /// Same for b_g2_query.
    pub b_g2: G2,
}

/// A reference proof with its intermediates.
#[derive(Clone, Debug)]
pub struct ReferenceProof {
    pub proof: Proof,
    /// A·z, B·z, C·z evaluations over the domain (a's input rows filled as libsnark does).
    pub a: Vec<Fr>,
    pub b: Vec<Fr>,
    pub c: Vec<Fr>,
    /// Coefficients of h(X) from the witness map (length = domain size).
    pub h: Vec<Fr>,
    pub msm: MsmResults,
}

/// The QAP evaluation domain for a constraint system.
pub fn domain(m: &ConstraintMatrices) -> Result<Radix2EvaluationDomain<Fr>, ReferenceError> {
    let size = m.num_constraints + m.num_instance_variables;
    Radix2EvaluationDomain::new(size).ok_or(ReferenceError::DomainTooLarge { size })
}

/// A·z, B·z and C·z evaluated on the domain.
pub type Evaluations = (Vec<Fr>, Vec<Fr>, Vec<Fr>);

/// Evaluates A·z, B·z and C·z on the domain exactly as LibsnarkReduction does.
pub fn evaluations(m: &ConstraintMatrices, z: &[Fr]) -> Result<Evaluations, ReferenceError> {
    check_len(m, z)?;
    let n = domain(m)?.size();
    let row = |mat: &ark_relations::gr1cs::Matrix<Fr>| {
        let mut v = Vec::new();
        fill_parallel(&mut v, n, |i| {
            mat.get(i)
                .map_or_else(Fr::zero, |terms| evaluate_constraint(terms, z))
        });
        v
    };
    let (mut a, (b, c)) = rayon::join(|| row(m.a()), || rayon::join(|| row(m.b()), || row(m.c())));
    let start = m.num_constraints;
    a[start..start + m.num_instance_variables].copy_from_slice(&z[..m.num_instance_variables]);
    Ok((a, b, c))
}

/// Sets `v` to `f(0..n)`, computed in parallel, in place when `v` already holds `n`
/// values and otherwise into a fresh vector written (and so first touched) in parallel:
/// at 2^22 a serial zero fill of fresh 128 MiB vectors cost more than the products.
pub(crate) fn fill_parallel(v: &mut Vec<Fr>, n: usize, f: impl Fn(usize) -> Fr + Sync) {
    use rayon::prelude::*;
    const MIN_LEN: usize = 1 << 12;
    if v.len() == n {
        v.par_iter_mut()
            .enumerate()
            .with_min_len(MIN_LEN)
            .for_each(|(i, out)| *out = f(i));
    } else {
        *v = (0..n)
            .into_par_iter()
            .with_min_len(MIN_LEN)
            .map(&f)
            .collect();
    }
}

/// The witness map's post-evaluation steps on the CPU (three inverse NTTs, three coset
/// NTTs, (a·b − c)/Z on the coset, one inverse coset NTT). The simulated device uses
/// this as its kernel; the tests check it equals ark-groth16's own witness map.
pub fn witness_map_from_evaluations(mut a: Vec<Fr>, mut b: Vec<Fr>, mut c: Vec<Fr>) -> Vec<Fr> {
    let n = a.len();
    let Some(domain) = GeneralEvaluationDomain::<Fr>::new(n) else {
        return Vec::new();
    };
    let coset = domain
        .get_coset(Fr::GENERATOR)
        .expect("the multiplicative generator spans a coset of every radix-2 domain");
    for v in [&mut a, &mut b, &mut c] {
        domain.ifft_in_place(v);
        coset.fft_in_place(v);
    }
    let z_inv = domain
        .evaluate_vanishing_polynomial(Fr::GENERATOR)
        .inverse()
        .expect("the generator is not an n-th root of unity, so Z(g) != 0");
    for ((x, y), w) in a.iter_mut().zip(&b).zip(&c) {
        *x = (*x * y - w) * z_inv;
    }
    coset.ifft_in_place(&mut a);
    a
}

/// ark-groth16's proof alone (no intermediates): what every pipeline proof is checked
/// against, at half the cost of [`prove`].
pub fn proof(
    pk: &ProvingKey,
    m: &ConstraintMatrices,
    z: &[Fr],
    r: Fr,
    s: Fr,
) -> Result<Proof, ReferenceError> {
    check_len(m, z)?;
    Ok(
        Groth16::<Curve, LibsnarkReduction>::create_proof_with_reduction_and_matrices(
            pk,
            r,
            s,
            m.as_slice(),
            m.num_instance_variables,
            m.num_constraints,
            z,
        )?,
    )
}

/// Proves with ark-groth16 and recomputes every intermediate alongside.
pub fn prove(
    pk: &ProvingKey,
    m: &ConstraintMatrices,
    z: &[Fr],
    r: Fr,
    s: Fr,
) -> Result<ReferenceProof, ReferenceError> {
    let proof = proof(pk, m, z, r, s)?;
    let matrices = m.as_slice();
    let h = LibsnarkReduction::witness_map_from_matrices::<Fr, GeneralEvaluationDomain<Fr>>(
        matrices,
        m.num_instance_variables,
        m.num_constraints,
        z,
    )?;
    let (a, b, c) = evaluations(m, z)?;
    let msm = msm_results(pk, m, z, &h);
    Ok(ReferenceProof {
        proof,
        a,
        b,
        c,
        h,
        msm,
    })
}

/// The five MSMs with arkworks, on the same inputs ark-groth16 uses.
pub fn msm_results(pk: &ProvingKey, m: &ConstraintMatrices, z: &[Fr], h: &[Fr]) -> MsmResults {
    let big = |v: &[Fr]| v.iter().map(|x| x.into_bigint()).collect::<Vec<_>>();
    let assignment = big(&z[1..]);
    let aux = big(&z[m.num_instance_variables..]);
    MsmResults {
        h: G1::msm_bigint(&pk.h_query, &big(h)),
        l: G1::msm_bigint(&pk.l_query, &aux),
        a: G1::msm_bigint(pk.a_query.get(1..).unwrap_or(&[]), &assignment),
        b_g1: G1::msm_bigint(pk.b_g1_query.get(1..).unwrap_or(&[]), &assignment),
        b_g2: G2::msm_bigint(pk.b_g2_query.get(1..).unwrap_or(&[]), &assignment),
    }
}

/// Folds MSM results and the blinding r, s into a proof exactly as ark-groth16 does
/// (`create_proof_with_assignment`), so any prover with the same MSM results produces
/// the same proof bytes.
pub fn assemble(pk: &ProvingKey, msm: &MsmResults, r: Fr, s: Fr) -> Proof {
    let first = |q: &[ark_bls12_381::G1Affine]| q.first().copied().unwrap_or_default();
    let g_a = pk.delta_g1 * r + first(&pk.a_query) + msm.a + pk.vk.alpha_g1;
    let g1_b = if r.is_zero() {
        G1::zero()
    } else {
        pk.delta_g1 * s + first(&pk.b_g1_query) + msm.b_g1 + pk.beta_g1
    };
    let g2_b = pk.vk.delta_g2 * s
        + pk.b_g2_query.first().copied().unwrap_or_default()
        + msm.b_g2
        + pk.vk.beta_g2;
    let g_c = g_a * s + g1_b * r - pk.delta_g1 * (r * s) + msm.l + msm.h;
    Proof {
        a: g_a.into_affine(),
        b: g2_b.into_affine(),
        c: g_c.into_affine(),
    }
}

pub(crate) fn check_len(m: &ConstraintMatrices, z: &[Fr]) -> Result<(), ReferenceError> {
    let expected = m.num_instance_variables + m.num_witness_variables;
    if z.len() != expected {
        return Err(ReferenceError::WitnessLength {
            expected,
            got: z.len(),
        });
    }
    Ok(())
}
