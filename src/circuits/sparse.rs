//! Random sparse R1CS with controllable density, satisfiable by construction.
//!
//! Layout. Every row `i` defines a fresh witness `w_i` (index `v_i = 1 + n + i`):
//!
//! ```text
//! (A_i . z) * (B_i . z) = w_i
//! ```
//!
//! `A_i` and `B_i` each hold `1..=2d-1` terms (mean `d`, the spec's density) over variables
//! before `v_i`: half from the last [`WINDOW`] variables, half from anywhere (the one and
//! the inputs included). A quarter of the rows repeat a variable: their last term has the
//! first term's index. Coefficients: 1 (1/2), -1 (1/8), 2..=16 (1/8), random non-zero (1/4).
//! The public inputs are random field elements from the witness RNG.

use super::{
    chunk_rng, enforce, expect_index, par_matrices, value, witness_rng, CircuitSpec, Row, Shape,
    VarMap, CHUNK_ROWS,
};
use crate::Fr;
use ark_ff::{AdditiveGroup, Field, UniformRand};
use ark_relations::gr1cs::{ConstraintSystemRef, Matrix, SynthesisError};
use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

/// Half of the terms come from this many preceding variables.
const WINDOW: usize = 64;

pub(super) fn num_witness(spec: &CircuitSpec) -> usize {
    spec.domain_size() - 1 - spec.num_inputs
}

fn coeff(rng: &mut ChaCha20Rng) -> Fr {
    match rng.gen_range(0..8u32) {
        0..=3 => Fr::ONE,
        4 => -Fr::ONE,
        5 => Fr::from(rng.gen_range(2..=16u64)),
        _ => loop {
            let c = Fr::rand(rng);
            if c != Fr::ZERO {
                break c;
            }
        },
    }
}

/// One row over the `v` variables before the one being defined.
fn row(rng: &mut ChaCha20Rng, v: usize, density: usize) -> Row {
    let len = rng.gen_range(1..2 * density);
    let mut row: Row = (0..len)
        .map(|_| {
            let index = if rng.gen::<bool>() {
                v - 1 - rng.gen_range(0..v.min(WINDOW))
            } else {
                rng.gen_range(0..v)
            };
            (coeff(rng), index)
        })
        .collect();
    if len >= 2 && rng.gen_ratio(1, 4) {
        row[len - 1].1 = row[0].1;
    }
    row
}

/// Rows `A_i, B_i` of one chunk, from that chunk's structure stream.
fn chunk_rows(
    spec: &CircuitSpec,
    chunk: usize,
    rows: std::ops::Range<usize>,
) -> impl Iterator<Item = (usize, Row, Row)> {
    let mut rng = chunk_rng(spec.structure_seed(), chunk as u64);
    let (n, d) = (spec.num_inputs, spec.density as usize);
    rows.map(move |i| {
        let v = 1 + n + i;
        let a = row(&mut rng, v, d);
        let b = row(&mut rng, v, d);
        (v, a, b)
    })
}

fn eval(row: &[(Fr, usize)], z: &[Fr]) -> Fr {
    row.iter().map(|&(c, i)| c * z[i]).sum()
}

pub(super) fn matrices(spec: &CircuitSpec, shape: &Shape) -> [Matrix<Fr>; 3] {
    par_matrices(shape.num_constraints, |chunk, first, a, b, c| {
        let rows = chunk_rows(spec, chunk, first..first + a.len());
        for (((a, b), c), (v, ra, rb)) in a.iter_mut().zip(b).zip(c).zip(rows) {
            (*a, *b, *c) = (ra, rb, vec![(Fr::ONE, v)]);
        }
    })
}

/// Chunks whose rows are drawn in parallel while the previous batch is evaluated.
const BATCH_CHUNKS: usize = 64;

/// Evaluation is sequential (a row may read the row just before it); drawing the rows is
/// not, so batches of chunks are drawn in parallel, overlapped with the evaluation.
pub(super) fn assignment(spec: &CircuitSpec, shape: &Shape, witness_seed: u64) -> Vec<Fr> {
    let mut rng = witness_rng(witness_seed);
    let mut z = Vec::with_capacity(shape.num_variables());
    z.push(Fr::ONE);
    z.extend((0..spec.num_inputs).map(|_| Fr::rand(&mut rng)));
    let rows = shape.num_constraints;
    let num_chunks = rows.div_ceil(CHUNK_ROWS);
    let draw = |batch: usize| -> Vec<(Row, Row)> {
        let chunks = batch * BATCH_CHUNKS..((batch + 1) * BATCH_CHUNKS).min(num_chunks);
        chunks
            .into_par_iter()
            .flat_map_iter(|chunk| {
                let first = chunk * CHUNK_ROWS;
                let end = (first + CHUNK_ROWS).min(rows);
                chunk_rows(spec, chunk, first..end).map(|(_, a, b)| (a, b))
            })
            .collect()
    };
    let mut batch = draw(0);
    for next in 1..=num_chunks.div_ceil(BATCH_CHUNKS) {
        let (drawn, ()) = rayon::join(
            || draw(next),
            || {
                for (a, b) in &batch {
                    let w = eval(a, &z) * eval(b, &z);
                    z.push(w);
                }
            },
        );
        batch = drawn;
    }
    z
}

pub(super) fn synthesize(
    spec: &CircuitSpec,
    shape: &Shape,
    witness_seed: Option<u64>,
    cs: &ConstraintSystemRef<Fr>,
) -> Result<(), SynthesisError> {
    let map = VarMap::new(shape);
    let mut rng = witness_seed.map(witness_rng);
    let mut z: Vec<Option<Fr>> = vec![Some(Fr::ONE)];
    for j in 0..spec.num_inputs {
        let v = rng.as_mut().map(Fr::rand);
        expect_index(cs.new_input_variable(value(v))?, map, 1 + j)?;
        z.push(v);
    }
    let eval = |row: &Row, z: &[Option<Fr>]| -> Option<Fr> {
        row.iter().map(|&(c, i)| z[i].map(|x| c * x)).sum()
    };
    for (chunk, first) in (0..shape.num_constraints).step_by(CHUNK_ROWS).enumerate() {
        let end = (first + CHUNK_ROWS).min(shape.num_constraints);
        for (v, a, b) in chunk_rows(spec, chunk, first..end) {
            let w = eval(&a, &z).zip(eval(&b, &z)).map(|(a, b)| a * b);
            expect_index(cs.new_witness_variable(value(w))?, map, v)?;
            z.push(w);
            enforce(cs, map, &a, &b, &[(Fr::ONE, v)])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circuits::Family;

    #[test]
    fn density_and_repeats() {
        for d in [1, 3, 8] {
            let spec = CircuitSpec::new(Family::Sparse, 12, 2)
                .unwrap()
                .with_density(d)
                .unwrap();
            let m = spec.constraints().unwrap();
            m.check(&spec.assignment(5).unwrap()).unwrap();
            let terms: usize = m.a().iter().chain(m.b()).map(Vec::len).sum();
            let mean = terms as f64 / (2 * m.num_constraints) as f64;
            assert!((mean - d as f64).abs() < 0.2, "density {d}: mean {mean}");
            let repeats = m
                .a()
                .iter()
                .filter(|r| r.len() >= 2 && r[0].1 == r[r.len() - 1].1)
                .count();
            assert_eq!(
                repeats > 0,
                d > 1,
                "density {d}: {repeats} rows repeat a variable"
            );
        }
    }
}
