//! CPU prep: everything a partition needs before it touches the GPU, done with no lock
//! held. A·z, B·z, C·z over the domain, the satisfiability check that falls out of
//! them, and the 0 / 1 / other classification of the MSM scalars.

use super::ProveError;
use crate::circuits::ConstraintMatrices;
use crate::device::{PartitionInputs, ScalarClasses, Shape};
use crate::reference;
use crate::sync::Arc;
use crate::Fr;

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
    let (a, b, c) = reference::evaluations(m, z).map_err(ProveError::from)?;
    if !z.first().is_some_and(ark_ff::One::is_one) {
        return Err(ProveError::InvalidInput(
            "the assignment must start with the constant one".into(),
        ));
    }
    let violated = {
        use rayon::prelude::*;
        (0..m.num_constraints)
            .into_par_iter()
            .with_min_len(1 << 12)
            .find_first(|&i| a[i] * b[i] != c[i])
    };
    if let Some(row) = violated {
        return Err(ProveError::Unsatisfied { constraint: row });
    }
    let scalars = z.get(1..).unwrap_or(&[]).to_vec();
    let classes = ScalarClasses::classify(&scalars);
    Ok(PartitionInputs {
        a,
        b,
        c,
        scalars: Arc::new(scalars),
        aux_start: m.num_instance_variables - 1,
        classes: Arc::new(classes),
    })
}

trait SizeUsize {
    fn size_usize(&self) -> usize;
}

impl SizeUsize for ark_poly::Radix2EvaluationDomain<Fr> {
    fn size_usize(&self) -> usize {
        ark_poly::EvaluationDomain::size(self)
    }
}
