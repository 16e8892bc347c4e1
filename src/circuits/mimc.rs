//! MiMC-style permutation chains: `x -> (x + k_r)^5`, dense full-width witness values.
//!
//! Layout. `n` chains, one per public input `x_j` (the chain's input). Round `r` belongs to
//! chain `r mod n`; its input is `x_r` for `r < n`, else the output `y_{r-n}` of the chain's
//! previous round. With `u = in + k_r` (the LC `[(1, in), (k_r, one)]`), round `r` takes rows
//! `3r..3r+3` and witness variables `s_r, q_r, y_r` (in that order):
//!
//! ```text
//! u   * u   = s_r        s_r = u^2
//! s_r * s_r = q_r        q_r = u^4
//! q_r * u   = y_r        y_r = u^5
//! ```
//!
//! `x^5` is a permutation of Fr because `gcd(5, r - 1) = 1` (`x^3` is not: `3 | r - 1`).
//! The `C mod 3` rows left over are `v * 1 = v` with `v` the last variable.

use super::{
    chunk_rng, enforce, expect_index, par_matrices, value, witness_rng, CircuitSpec, Row, Shape,
    VarMap, CHUNK_ROWS,
};
use crate::Fr;
use ark_ff::{AdditiveGroup, Field, UniformRand};
use ark_relations::gr1cs::{ConstraintSystemRef, Matrix, SynthesisError, Variable};
use rayon::prelude::*;

/// Rounds of the circuit: three rows each.
fn num_rounds(shape_constraints: usize) -> usize {
    shape_constraints / 3
}

pub(super) fn num_witness(spec: &CircuitSpec) -> usize {
    3 * num_rounds(spec.domain_size() - 1 - spec.num_inputs)
}

/// Round constants `k_r`, non-zero, from per-chunk streams of the structure seed.
fn round_constants(spec: &CircuitSpec, rounds: usize) -> Vec<Fr> {
    let seed = spec.structure_seed();
    let mut k = vec![Fr::ZERO; rounds];
    k.par_chunks_mut(CHUNK_ROWS)
        .enumerate()
        .for_each(|(chunk, ks)| {
            let mut rng = chunk_rng(seed, chunk as u64);
            for k in ks {
                while *k == Fr::ZERO {
                    *k = Fr::rand(&mut rng);
                }
            }
        });
    k
}

/// Index of round `r`'s input in the full assignment.
fn input_index(n: usize, r: usize) -> usize {
    if r < n {
        1 + r
    } else {
        // y_{r-n} is witness 3(r-n)+2.
        1 + n + 3 * (r - n) + 2
    }
}

pub(super) fn matrices(spec: &CircuitSpec, shape: &Shape) -> [Matrix<Fr>; 3] {
    let n = spec.num_inputs;
    let rounds = num_rounds(shape.num_constraints);
    let k = round_constants(spec, rounds);
    let last = shape.num_variables() - 1;
    let w = 1 + n; // index of the first witness variable
    par_matrices(shape.num_constraints, |_, first, a, b, c| {
        for (off, ((a, b), c)) in a.iter_mut().zip(b).zip(c).enumerate() {
            let row = first + off;
            let r = row / 3;
            if r >= rounds {
                pad_row(last, a, b, c);
                continue;
            }
            let u: Row = vec![(Fr::ONE, input_index(n, r)), (k[r], 0)];
            let (s, q, y) = (w + 3 * r, w + 3 * r + 1, w + 3 * r + 2);
            match row % 3 {
                0 => (*a, *b, *c) = (u.clone(), u, vec![(Fr::ONE, s)]),
                1 => (*a, *b, *c) = (vec![(Fr::ONE, s)], vec![(Fr::ONE, s)], vec![(Fr::ONE, q)]),
                _ => (*a, *b, *c) = (vec![(Fr::ONE, q)], u, vec![(Fr::ONE, y)]),
            }
        }
    })
}

/// The padding row `v * 1 = v`.
fn pad_row(v: usize, a: &mut Row, b: &mut Row, c: &mut Row) {
    *a = vec![(Fr::ONE, v)];
    *b = vec![(Fr::ONE, 0)];
    *c = vec![(Fr::ONE, v)];
}

pub(super) fn assignment(spec: &CircuitSpec, shape: &Shape, witness_seed: u64) -> Vec<Fr> {
    let n = spec.num_inputs;
    let rounds = num_rounds(shape.num_constraints);
    let k = round_constants(spec, rounds);
    let mut rng = witness_rng(witness_seed);
    let mut z = Vec::with_capacity(shape.num_variables());
    z.push(Fr::ONE);
    z.extend((0..n).map(|_| Fr::rand(&mut rng)));
    for (r, k) in k.iter().enumerate() {
        let u = z[input_index(n, r)] + k;
        let s = u.square();
        let q = s.square();
        z.extend([s, q, q * u]);
    }
    z
}

pub(super) fn synthesize(
    spec: &CircuitSpec,
    shape: &Shape,
    witness_seed: Option<u64>,
    cs: &ConstraintSystemRef<Fr>,
) -> Result<(), SynthesisError> {
    let n = spec.num_inputs;
    let rounds = num_rounds(shape.num_constraints);
    let k = round_constants(spec, rounds);
    let map = VarMap::new(shape);
    let mut rng = witness_seed.map(witness_rng);
    // Chain state: (variable, value) of each chain's current link.
    let mut chain: Vec<(Variable, Option<Fr>)> = Vec::with_capacity(n);
    for _ in 0..n {
        let v = rng.as_mut().map(Fr::rand);
        chain.push((cs.new_input_variable(value(v))?, v));
    }
    let mut last = chain[n - 1].0;
    let mut next_witness = 1 + n;
    let mut alloc = |v: Option<Fr>| -> Result<Variable, SynthesisError> {
        let var = cs.new_witness_variable(value(v))?;
        expect_index(var, map, next_witness)?;
        next_witness += 1;
        Ok(var)
    };
    for (r, k) in k.iter().enumerate() {
        let (x, xv) = chain[r % n];
        let u = || ark_relations::gr1cs::LinearCombination(vec![(Fr::ONE, x), (*k, Variable::One)]);
        let uv = xv.map(|x| x + k);
        let sv = uv.map(|u| u.square());
        let s = alloc(sv)?;
        cs.enforce_r1cs_constraint(u, u, || s.into())?;
        let qv = sv.map(|s| s.square());
        let q = alloc(qv)?;
        cs.enforce_r1cs_constraint(|| s.into(), || s.into(), || q.into())?;
        let yv = qv.zip(uv).map(|(q, u)| q * u);
        let y = alloc(yv)?;
        cs.enforce_r1cs_constraint(|| q.into(), u, || y.into())?;
        chain[r % n] = (y, yv);
        last = y;
    }
    let last_index = shape.num_variables() - 1;
    expect_index(last, map, last_index)?;
    for _ in 3 * rounds..shape.num_constraints {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        pad_row(last_index, &mut a, &mut b, &mut c);
        enforce(cs, map, &a, &b, &c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circuits::Family;

    #[test]
    fn rows_per_round_and_padding() {
        // 2^5 = 32: 2 inputs, 29 constraints = 9 rounds + 2 pads.
        let spec = CircuitSpec::new(Family::Mimc, 5, 2).unwrap();
        let m = spec.constraints().unwrap();
        assert_eq!(m.num_constraints, 29);
        assert_eq!(m.num_witness_variables, 27);
        assert_eq!(m.a()[27], vec![(Fr::ONE, 29)]);
        let z = spec.assignment(1).unwrap();
        m.check(&z).unwrap();
        // The witness is full width: no value is 0 or 1.
        assert!(z[3..].iter().all(|v| *v != Fr::ZERO && *v != Fr::ONE));
    }
}
