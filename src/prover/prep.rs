//! CPU prep: everything a partition needs before it touches the GPU, done with no lock
//! held. A·z, B·z, C·z over the domain, the satisfiability check that falls out of
//! them, and the 0 / 1 / other classification of the MSM scalars.

use ark_ff::{One, Zero};

use super::ProveError;
use crate::circuits::ConstraintMatrices;
use crate::device::{HostVec, PartitionInputs, ScalarClasses, Shape};
use crate::reference;
use crate::sync::Arc;
use crate::Fr;
use ark_relations::gr1cs::Matrix;

/// The sizes that fix a partition's working set.
pub fn shape(m: &ConstraintMatrices) -> Result<Shape, ProveError> {
    Ok(Shape {
        domain_size: reference::domain(m).map_err(ProveError::from)?.size_usize(),
        num_scalars: m.num_instance_variables + m.num_witness_variables - 1,
        num_aux: m.num_witness_variables,
    })
}

/// Evaluates and classifies one partition. An assignment of the wrong length or one
/// that violates a constraint is a typed error, never a wrong proof.
pub fn prepare(m: &ConstraintMatrices, z: &[Fr]) -> Result<PartitionInputs, ProveError> {
    prepare_reusing(m, z, &mut None)
}

/// [`prepare`] into the buffers of `spare`, a finished partition's inputs (a worker
/// hands back its previous partition's): the vectors keep their pages, which at 2^22
/// saves half a gigabyte of first touches a partition. On an error the buffers are
/// back in `spare`, for the worker's next partition.
pub fn prepare_reusing(
    m: &ConstraintMatrices,
    z: &[Fr],
    spare: &mut Option<PartitionInputs>,
) -> Result<PartitionInputs, ProveError> {
    let (mut evals, mut classes, mut aux_classes) = match spare.take() {
        Some(PartitionInputs {
            a,
            b,
            c,
            classes,
            aux_classes,
        }) => {
            // Only unshared vectors can be rewritten.
            let reuse = |v: Arc<ScalarClasses>| Arc::try_unwrap(v).unwrap_or_default();
            ([a, b, c], reuse(classes), reuse(aux_classes))
        }
        None => Default::default(),
    };
    let checked = evaluate(m, z, &mut evals).and_then(|violated| {
        if !z.first().is_some_and(One::is_one) {
            return Err(ProveError::InvalidInput(
                "the assignment must start with the constant one".into(),
            ));
        }
        violated.map_or(Ok(()), |row| {
            Err(ProveError::Unsatisfied { constraint: row })
        })
    });
    let [a, b, c] = evals;
    if let Err(e) = checked {
        *spare = Some(PartitionInputs {
            a,
            b,
            c,
            classes: Arc::new(classes),
            aux_classes: Arc::new(aux_classes),
        });
        return Err(e);
    }
    classes.classify_into(&z[1..]);
    classes.suffix_into(m.num_instance_variables - 1, &mut aux_classes);
    Ok(PartitionInputs {
        a,
        b,
        c,
        aux_classes: Arc::new(aux_classes),
        classes: Arc::new(classes),
    })
}

/// A·z, B·z and C·z over the domain into `out` (in place where its vectors already
/// have the domain's length), as [`reference::evaluations`], and the first constraint
/// they violate: one parallel pass over the rows, so the check reads no memory again.
fn evaluate(
    m: &ConstraintMatrices,
    z: &[Fr],
    out: &mut [HostVec; 3],
) -> Result<Option<usize>, ProveError> {
    use rayon::prelude::*;
    reference::check_len(m, z).map_err(ProveError::from)?;
    let n = reference::domain(m).map_err(ProveError::from)?.size_usize();
    let [a, b, c] = out;
    let (a, b, c) = (a.writable(n)?, b.writable(n)?, c.writable(n)?);
    let row = |mat: &Matrix<Fr>, i: usize| mat.get(i).map_or_else(Fr::zero, |t| evaluate_row(t, z));
    let violated = a
        .par_iter_mut()
        .zip(b.par_iter_mut())
        .zip(c.par_iter_mut())
        .enumerate()
        .with_min_len(1 << 12)
        .filter_map(|(i, ((a, b), c))| {
            (*a, *b, *c) = (row(m.a(), i), row(m.b(), i), row(m.c(), i));
            (i < m.num_constraints && product(a, b) != *c).then_some(i)
        })
        .min();
    // The instance rows of A, as libsnark fills them.
    let (start, inputs) = (m.num_constraints, m.num_instance_variables);
    a[start..start + inputs].copy_from_slice(&z[..inputs]);
    Ok(violated)
}

/// Σ coeff · z[index] over a row's terms, equal to arkworks' `evaluate_constraint`,
/// without the products whose value is 0 or 1: a boolean circuit's witness is mostly
/// bits, so this skips most of its rows' products (at 2^22 they were most of prep).
fn evaluate_row(terms: &[(Fr, usize)], z: &[Fr]) -> Fr {
    terms.iter().fold(Fr::zero(), |sum, (coeff, index)| {
        let value = &z[*index];
        if value.is_zero() {
            sum
        } else if value.is_one() {
            sum + coeff
        } else if coeff.is_one() {
            sum + value
        } else {
            sum + *value * coeff
        }
    })
}

/// x · y, without the product when either is 0 or 1.
fn product(x: &Fr, y: &Fr) -> Fr {
    if x.is_zero() || y.is_zero() {
        Fr::zero()
    } else if x.is_one() {
        *y
    } else if y.is_one() {
        *x
    } else {
        *x * y
    }
}

trait SizeUsize {
    fn size_usize(&self) -> usize;
}

impl SizeUsize for ark_poly::Radix2EvaluationDomain<Fr> {
    fn size_usize(&self) -> usize {
        ark_poly::EvaluationDomain::size(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::UniformRand;
    use ark_groth16::r1cs_to_qap::evaluate_constraint;
    use rand::{Rng, SeedableRng};

    /// The skipping row product against arkworks' on values and coefficients drawn from
    /// 0, 1, −1 and random elements.
    #[test]
    fn evaluate_row_equals_arkworks() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let pick = |rng: &mut rand_chacha::ChaCha20Rng| match rng.gen_range(0..4) {
            0 => Fr::zero(),
            1 => Fr::one(),
            2 => -Fr::one(),
            _ => Fr::rand(rng),
        };
        let z: Vec<Fr> = (0..64).map(|_| pick(&mut rng)).collect();
        for len in 0..12 {
            for _ in 0..50 {
                let terms: Vec<(Fr, usize)> = (0..len)
                    .map(|_| (pick(&mut rng), rng.gen_range(0..z.len())))
                    .collect();
                assert_eq!(evaluate_row(&terms, &z), evaluate_constraint(&terms, &z));
            }
        }
        for x in &z {
            for y in &z {
                assert_eq!(product(x, y), *x * y);
            }
        }
    }

    /// Prep, fresh and into a finished partition's buffers (of another size, then of
    /// the same), gives the reference evaluations and scalars for every family.
    #[test]
    fn prepare_reusing_equals_fresh_and_reference() {
        use crate::circuits::{CircuitSpec, Family};
        let mut spare = None;
        for (family, log) in [
            (Family::Boolean, 8),
            (Family::Mimc, 9),
            (Family::Mimc, 9),
            (Family::Sparse, 8),
            (Family::Boolean, 7),
        ] {
            let spec = CircuitSpec {
                family,
                log_constraints: log,
                num_inputs: 2,
                density: 3,
            };
            let m = spec.constraints().unwrap();
            let z = spec.assignment(3).unwrap();
            let (a, b, c) = reference::evaluations(&m, &z).unwrap();
            let got = prepare_reusing(&m, &z, &mut spare).unwrap();
            assert_eq!(
                (&got.a[..], &got.b[..], &got.c[..]),
                (&a[..], &b[..], &c[..]),
                "{family:?} 2^{log}"
            );
            assert_eq!(*got.classes, ScalarClasses::classify(&z[1..]));
            let aux = &z[m.num_instance_variables..];
            assert_eq!(*got.aux_classes, ScalarClasses::classify(aux));
            spare = Some(got);
        }
    }
}
