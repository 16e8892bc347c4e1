//! Boolean-heavy circuits in the manner of SHA-256 (Filecoin PoRep): fresh bits with
//! booleanity checks, XOR and AND on bits, and bit packing (a range check of a word).
//!
//! Layout. With `n` public inputs and `C = 2^log - 1 - n` constraints, the body has
//! `C - n` rows, body row `i` defining witness `w_i` (index `1 + n + i`). Its kind follows
//! `i mod 16` ([`PATTERN`]):
//!
//! ```text
//! Fresh:        w * (1 - w) = 0               a bit from the witness RNG
//! Xor(a, b):   2a * b       = a + b - w       w = a xor b
//! And(a, b):    a * b       = w
//! Pack:        (sum_t 2^t bit_t) * 1 = w      the 32 most recent bits, newest first
//! ```
//!
//! XOR and AND read two bits from the last [`WINDOW`] rows (possibly the same bit twice,
//! which repeats a variable in a row). The last `n` rows define the public inputs as words:
//! `(sum_t 2^t bit_t) * 1 = x_j` over 32 bits picked at random from the body. Every value
//! but the packed words is 0 or 1.

use super::{
    chunk_rng, enforce, expect_index, par_matrices, value, witness_rng, CircuitSpec, Row, Shape,
    VarMap, CHUNK_ROWS,
};
use crate::Fr;
use ark_ff::{AdditiveGroup, Field};
use ark_relations::gr1cs::{ConstraintSystemRef, Matrix, SynthesisError};
use rand::Rng;
use rand_chacha::ChaCha20Rng;

/// Bits per packed word.
const WORD: usize = 32;
/// XOR and AND operands come from this many preceding rows.
const WINDOW: usize = 256;
/// The RNG stream of the output rows (body chunks use streams `0..`).
const OUTPUT_STREAM: u64 = 1 << 63;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fresh,
    Xor,
    And,
    Pack,
}

/// Row kinds by `i mod 16`: 5 fresh bits, 6 XOR, 4 AND, 1 pack. `Pack` only in the last slot,
/// so the row before a pack is always a bit, and the first two rows are fresh.
const PATTERN: [Kind; 16] = {
    use Kind::*;
    [
        Fresh, Fresh, Xor, And, Xor, Fresh, Xor, And, Fresh, Xor, Xor, And, Fresh, Xor, And, Pack,
    ]
};

/// A body row, in body indices (row `i` defines `w_i`).
#[derive(Clone, Copy, Debug)]
enum BodyRow {
    Fresh,
    Xor(usize, usize),
    And(usize, usize),
    Pack,
}

fn is_bit(i: usize) -> bool {
    PATTERN[i % PATTERN.len()] != Kind::Pack
}

/// The body rows of one chunk, drawn from that chunk's structure stream.
fn body_chunk(
    seed: u64,
    chunk: usize,
    rows: std::ops::Range<usize>,
) -> impl Iterator<Item = BodyRow> {
    let mut rng = chunk_rng(seed, chunk as u64);
    rows.map(move |i| match PATTERN[i % PATTERN.len()] {
        Kind::Fresh => BodyRow::Fresh,
        Kind::Pack => BodyRow::Pack,
        Kind::Xor => BodyRow::Xor(pick_bit(&mut rng, i), pick_bit(&mut rng, i)),
        Kind::And => BodyRow::And(pick_bit(&mut rng, i), pick_bit(&mut rng, i)),
    })
}

/// A bit row among the `WINDOW` rows before `i` (`i >= 2`).
fn pick_bit(rng: &mut ChaCha20Rng, i: usize) -> usize {
    let j = i - 1 - rng.gen_range(0..i.min(WINDOW));
    if is_bit(j) {
        j
    } else {
        j - 1
    }
}

/// The bits row `i` packs: the `WORD` most recent bit rows before `i`, newest first.
fn pack_bits(i: usize) -> impl Iterator<Item = usize> {
    (0..i).rev().filter(|&j| is_bit(j)).take(WORD)
}

/// The body bits output `j` packs: `WORD` random bit rows of the body (repeats allowed).
fn output_bits(seed: u64, body_len: usize, n: usize) -> Vec<Vec<usize>> {
    let mut rng = chunk_rng(seed, OUTPUT_STREAM);
    (0..n)
        .map(|_| {
            (0..WORD.min(body_len))
                .map(|_| {
                    let j = rng.gen_range(0..body_len);
                    if is_bit(j) {
                        j
                    } else {
                        j - 1
                    }
                })
                .collect()
        })
        .collect()
}

pub(super) fn num_witness(spec: &CircuitSpec) -> usize {
    body_len(spec.domain_size() - 1 - spec.num_inputs, spec.num_inputs)
}

fn body_len(num_constraints: usize, n: usize) -> usize {
    num_constraints - n
}

fn pow2(t: usize) -> Fr {
    Fr::from(1u64 << t)
}

/// The rows of body row `i` in full-assignment indices (`w` the index of `w_0`).
fn body_rows(row: BodyRow, i: usize, w: usize) -> (Row, Row, Row) {
    let one = Fr::ONE;
    match row {
        BodyRow::Fresh => (
            vec![(one, w + i)],
            vec![(one, 0), (-one, w + i)],
            Vec::new(),
        ),
        BodyRow::Xor(a, b) => (
            vec![(one.double(), w + a)],
            vec![(one, w + b)],
            vec![(one, w + a), (one, w + b), (-one, w + i)],
        ),
        BodyRow::And(a, b) => (vec![(one, w + a)], vec![(one, w + b)], vec![(one, w + i)]),
        BodyRow::Pack => pack_rows(pack_bits(i).map(|j| w + j), w + i),
    }
}

/// `(sum_t 2^t bit_t) * 1 = out`.
fn pack_rows(bits: impl Iterator<Item = usize>, out: usize) -> (Row, Row, Row) {
    let a = bits.enumerate().map(|(t, j)| (pow2(t), j)).collect();
    (a, vec![(Fr::ONE, 0)], vec![(Fr::ONE, out)])
}

pub(super) fn matrices(spec: &CircuitSpec, shape: &Shape) -> [Matrix<Fr>; 3] {
    let n = spec.num_inputs;
    let seed = spec.structure_seed();
    let body = body_len(shape.num_constraints, n);
    let outputs = output_bits(seed, body, n);
    let w = 1 + n;
    par_matrices(shape.num_constraints, |chunk, first, a, b, c| {
        let end = (first + a.len()).min(body);
        let mut rows = body_chunk(seed, chunk, first..end);
        for (off, ((a, b), c)) in a.iter_mut().zip(b).zip(c).enumerate() {
            let i = first + off;
            (*a, *b, *c) = match rows.next() {
                Some(row) => body_rows(row, i, w),
                None => pack_rows(outputs[i - body].iter().map(|&j| w + j), 1 + (i - body)),
            };
        }
    })
}

pub(super) fn assignment(spec: &CircuitSpec, shape: &Shape, witness_seed: u64) -> Vec<Fr> {
    let n = spec.num_inputs;
    let seed = spec.structure_seed();
    let body = body_len(shape.num_constraints, n);
    let mut rng = witness_rng(witness_seed);
    // Values as integers first (bits and 32-bit words), field elements at the end.
    let mut vals: Vec<u64> = Vec::with_capacity(body);
    for (chunk, first) in (0..body).step_by(CHUNK_ROWS).enumerate() {
        let end = (first + CHUNK_ROWS).min(body);
        for (off, row) in body_chunk(seed, chunk, first..end).enumerate() {
            let v = match row {
                BodyRow::Fresh => u64::from(rng.gen::<bool>()),
                BodyRow::Xor(a, b) => vals[a] ^ vals[b],
                BodyRow::And(a, b) => vals[a] & vals[b],
                BodyRow::Pack => pack_u64(pack_bits(first + off).map(|j| vals[j])),
            };
            vals.push(v);
        }
    }
    let inputs = output_bits(seed, body, n)
        .into_iter()
        .map(|bits| pack_u64(bits.iter().map(|&j| vals[j])));
    let mut z = Vec::with_capacity(shape.num_variables());
    z.push(Fr::ONE);
    z.extend(inputs.map(Fr::from));
    z.extend(vals.into_iter().map(Fr::from));
    z
}

fn pack_u64(bits: impl Iterator<Item = u64>) -> u64 {
    bits.enumerate().fold(0, |acc, (t, b)| acc + (b << t))
}

/// The natural synthesis: field arithmetic on `Fr` values (`a xor b = a + b - 2ab`).
pub(super) fn synthesize(
    spec: &CircuitSpec,
    shape: &Shape,
    witness_seed: Option<u64>,
    cs: &ConstraintSystemRef<Fr>,
) -> Result<(), SynthesisError> {
    let n = spec.num_inputs;
    let seed = spec.structure_seed();
    let body = body_len(shape.num_constraints, n);
    let map = VarMap::new(shape);
    let w = 1 + n;
    let mut rng = witness_seed.map(witness_rng);
    let mut vals: Vec<Option<Fr>> = Vec::with_capacity(body);
    let mut body_out = Vec::with_capacity(body);
    for (chunk, first) in (0..body).step_by(CHUNK_ROWS).enumerate() {
        let end = (first + CHUNK_ROWS).min(body);
        for (off, row) in body_chunk(seed, chunk, first..end).enumerate() {
            let i = first + off;
            let two = Fr::from(2u64);
            let v = match row {
                BodyRow::Fresh => rng.as_mut().map(|rng| Fr::from(rng.gen::<bool>())),
                BodyRow::Xor(a, b) => vals[a].zip(vals[b]).map(|(a, b)| a + b - two * a * b),
                BodyRow::And(a, b) => vals[a].zip(vals[b]).map(|(a, b)| a * b),
                BodyRow::Pack => pack_bits(i)
                    .enumerate()
                    .map(|(t, j)| vals[j].map(|b| pow2(t) * b))
                    .sum(),
            };
            vals.push(v);
            body_out.push((row, i));
        }
    }
    let outputs = output_bits(seed, body, n);
    for (j, bits) in outputs.iter().enumerate() {
        let v: Option<Fr> = bits
            .iter()
            .enumerate()
            .map(|(t, &k)| vals[k].map(|b| pow2(t) * b))
            .sum();
        let var = cs.new_input_variable(value(v))?;
        expect_index(var, map, 1 + j)?;
    }
    for (i, v) in vals.iter().enumerate() {
        let var = cs.new_witness_variable(value(*v))?;
        expect_index(var, map, w + i)?;
    }
    for (row, i) in body_out {
        let (a, b, c) = body_rows(row, i, w);
        enforce(cs, map, &a, &b, &c)?;
    }
    for (j, bits) in outputs.iter().enumerate() {
        let (a, b, c) = pack_rows(bits.iter().map(|&k| w + k), 1 + j);
        enforce(cs, map, &a, &b, &c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circuits::Family;

    #[test]
    fn mostly_bits() {
        let spec = CircuitSpec::new(Family::Boolean, 12, 4).unwrap();
        let m = spec.constraints().unwrap();
        let z = spec.assignment(3).unwrap();
        m.check(&z).unwrap();
        let bits = z
            .iter()
            .filter(|v| **v == Fr::ZERO || **v == Fr::ONE)
            .count();
        assert!(bits * 100 >= z.len() * 90, "{bits} of {}", z.len());
        // Packs are 32 bits wide once enough bits precede them.
        assert_eq!(m.a()[1023].len(), WORD);
    }
}
