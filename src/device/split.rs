//! The CPU prep's 0 / 1 / other classification of MSM scalars, and the split MSM it
//! enables: zeros are skipped, ones are a batch addition of their bases, and only the
//! others go through Pippenger. Boolean-heavy circuits (SHA-256 in PoRep) are mostly
//! zeros and ones, so the split removes most of the MSM work.

use ark_ec::VariableBaseMSM;
use ark_ff::{One, PrimeField, Zero};

use crate::Fr;

/// Sorted indices of the scalars equal to one and of the others (neither 0 nor 1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScalarClasses {
    pub len: usize,
    pub ones: Vec<u32>,
    pub others: Vec<u32>,
}

impl ScalarClasses {
    /// Classifies `scalars`. Indices are u32: a partition has < 2^32 scalars.
    pub fn classify(scalars: &[Fr]) -> Self {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 16;
        // Chunks in parallel, then concatenated in order, so the lists stay sorted.
        let parts: Vec<(Vec<u32>, Vec<u32>)> = scalars
            .par_chunks(CHUNK)
            .enumerate()
            .map(|(c, chunk)| {
                let (mut ones, mut others) = (Vec::new(), Vec::new());
                for (j, s) in chunk.iter().enumerate() {
                    let i = (c * CHUNK + j) as u32;
                    if s.is_one() {
                        ones.push(i);
                    } else if !s.is_zero() {
                        others.push(i);
                    }
                }
                (ones, others)
            })
            .collect();
        let (ones, others) = parts.into_iter().unzip::<_, _, Vec<_>, Vec<_>>();
        ScalarClasses {
            len: scalars.len(),
            ones: ones.concat(),
            others: others.concat(),
        }
    }

    pub fn zeros(&self) -> usize {
        self.len - self.ones.len() - self.others.len()
    }

    /// The ones and others at or after `start`, re-indexed from `start` (the L query
    /// uses the aux part of the scalars).
    pub fn suffix(&self, start: usize) -> ScalarClasses {
        let tail = |v: &[u32]| {
            let from = v.partition_point(|&i| (i as usize) < start);
            v[from..].iter().map(|&i| i - start as u32).collect()
        };
        ScalarClasses {
            len: self.len.saturating_sub(start),
            ones: tail(&self.ones),
            others: tail(&self.others),
        }
    }
}

/// Σ scalars_i · bases_i computed as batch addition over the ones plus an MSM over the
/// others. `bases` may be longer than the scalars (extra bases are ignored, as in
/// arkworks' `msm_bigint`); indices past the bases are ignored likewise.
pub fn msm_split<G>(bases: &[G::MulBase], scalars: &[Fr], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    msm_ones::<G>(bases, scalars, classes) + msm_others::<G>(bases, scalars, classes)
}

/// The ones' part of [`msm_split`] alone: Σ bases_i over the scalars equal to one (the
/// batch addition a device runs).
pub fn msm_ones<G>(bases: &[G::MulBase], scalars: &[Fr], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    use rayon::prelude::*;
    let n = bases.len().min(scalars.len());
    // In parallel: a boolean circuit has about n/2 ones, and one core's sequential G2
    // fold was the CPU critical path at 2^22 (3.7 s per partition).
    classes
        .ones
        .par_iter()
        .filter(|&&i| (i as usize) < n)
        .fold(G::zero, |acc, &i| acc + bases[i as usize])
        .reduce(G::zero, |a, b| a + b)
}

/// The others' part of [`msm_split`] alone: Σ scalars_i · bases_i over the scalars that
/// are neither 0 nor 1 (for when the ones were summed elsewhere, e.g. on the device).
pub fn msm_others<G>(bases: &[G::MulBase], scalars: &[Fr], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    let n = bases.len().min(scalars.len());
    let (b, s): (Vec<G::MulBase>, Vec<_>) = classes
        .others
        .iter()
        .filter(|&&i| (i as usize) < n)
        .map(|&i| (bases[i as usize], scalars[i as usize].into_bigint()))
        .unzip();
    G::msm_bigint(&b, &s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_bls12_381::{G1Affine, G1Projective as G1};
    use ark_std::UniformRand;
    use rand::{Rng, SeedableRng};

    #[test]
    fn split_equals_plain_msm_on_mixed_scalars() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [0usize, 1, 2, 31, 33, 100] {
            let bases: Vec<G1Affine> = (0..n).map(|_| G1Affine::rand(&mut rng)).collect();
            let scalars: Vec<Fr> = (0..n)
                .map(|_| match rng.gen_range(0..3) {
                    0 => Fr::zero(),
                    1 => Fr::one(),
                    _ => Fr::rand(&mut rng),
                })
                .collect();
            let classes = ScalarClasses::classify(&scalars);
            assert_eq!(
                classes.zeros() + classes.ones.len() + classes.others.len(),
                n
            );
            assert_eq!(
                msm_split::<G1>(&bases, &scalars, &classes),
                G1::msm(&bases, &scalars).unwrap()
            );
        }
    }

    #[test]
    fn suffix_reindexes() {
        let s = [
            Fr::one(),
            Fr::from(5u64),
            Fr::zero(),
            Fr::one(),
            Fr::from(9u64),
        ];
        let c = ScalarClasses::classify(&s).suffix(2);
        assert_eq!(c.len, 3);
        assert_eq!(c.ones, vec![1]);
        assert_eq!(c.others, vec![2]);
    }
}
