//! The CPU prep's 0 / 1 / other classification of MSM scalars, and the split MSM it
//! enables: zeros are skipped, ones are a batch addition of their bases, and only the
//! others go through Pippenger. Boolean-heavy circuits (SHA-256 in PoRep) are mostly
//! zeros and ones, so the split removes most of the MSM work.
//!
//! The classification is in the form a device consumes (a bitmap of the ones, the
//! others' indices and scalars gathered), so a partition's upload only copies it: the
//! prep builds it with no lock held, where it overlaps other partitions' GPU work.

use std::mem::take;

use ark_ec::VariableBaseMSM;
use ark_ff::{One, PrimeField, Zero};
use rayon::prelude::*;

use crate::Fr;

/// The scalars equal to one as a bitmap (bit i % 32 of word i / 32 is set iff scalar i
/// is one), and the others (neither 0 nor 1) as ascending indices with their scalars.
/// Zeros are in neither. Built only by [`ScalarClasses::classify`] and
/// [`ScalarClasses::suffix_into`], so every index is below `len` and no bit past `len` is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScalarClasses {
    len: usize,
    ones: Vec<u32>,
    ones_count: usize,
    other_indices: Vec<u32>,
    other_scalars: Vec<Fr>,
}

impl ScalarClasses {
    /// Classifies `scalars` (in parallel). Indices are u32: a partition has < 2^32
    /// scalars (2^32 of them would be 128 GiB).
    pub fn classify(scalars: &[Fr]) -> Self {
        let mut classes = Self::default();
        classes.classify_into(scalars);
        classes
    }

    /// [`ScalarClasses::classify`] into this value's vectors, which keep their pages (a
    /// worker reuses its previous partition's).
    pub fn classify_into(&mut self, scalars: &[Fr]) {
        let word = |c: &[Fr]| {
            (c.iter().enumerate()).fold(0u32, |w, (b, s)| w | u32::from(s.is_one()) << b)
        };
        self.len = scalars.len();
        self.ones.clear();
        self.ones.par_extend(scalars.par_chunks(32).map(word));
        self.ones_count = self.ones.par_iter().map(|w| w.count_ones() as usize).sum();
        self.other_indices.clear();
        self.other_scalars.clear();
        // Filtered in parallel, extended in order, so the indices stay ascending.
        let others = (scalars.par_iter().enumerate())
            .filter(|(_, s)| !s.is_zero() && !s.is_one())
            .map(|(i, s)| (i as u32, *s));
        let mut pair = (take(&mut self.other_indices), take(&mut self.other_scalars));
        pair.par_extend(others);
        (self.other_indices, self.other_scalars) = pair;
    }

    /// The classes of `scalars[start..]`, re-indexed from `start` (the L query's
    /// scalars are the aux part), into `out`'s vectors (which keep their pages),
    /// without a rescan of the scalars.
    pub fn suffix_into(&self, start: usize, out: &mut ScalarClasses) {
        let start = start.min(self.len);
        out.len = self.len - start;
        let (q, r) = (start / 32, start % 32);
        // Word j of the suffix is bits start + 32j .. start + 32j + 32 of the bitmap.
        out.ones.clear();
        out.ones
            .par_extend((0..out.len.div_ceil(32)).into_par_iter().map(|j| {
                let lo = self.ones[q + j] >> r;
                let hi = match (r, self.ones.get(q + j + 1)) {
                    (1.., Some(next)) => next << (32 - r),
                    _ => 0,
                };
                lo | hi
            }));
        out.ones_count = out.ones.par_iter().map(|w| w.count_ones() as usize).sum();
        let from = self
            .other_indices
            .partition_point(|&i| (i as usize) < start);
        out.other_indices.clear();
        out.other_indices.par_extend(
            self.other_indices[from..]
                .par_iter()
                .map(|&i| i - start as u32),
        );
        // A dense circuit's others are nearly all its scalars: copied in parallel.
        out.other_scalars.clear();
        out.other_scalars
            .par_extend(self.other_scalars[from..].par_iter().copied());
    }

    /// How many scalars were classified.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The ones' bitmap: ⌈len / 32⌉ words.
    pub fn ones_words(&self) -> &[u32] {
        &self.ones
    }
    pub fn ones_count(&self) -> usize {
        self.ones_count
    }
    pub fn other_indices(&self) -> &[u32] {
        &self.other_indices
    }
    pub fn other_scalars(&self) -> &[Fr] {
        &self.other_scalars
    }
    pub fn zeros(&self) -> usize {
        self.len - self.ones_count - self.other_indices.len()
    }
}

/// The indices of `word`'s set bits, word `w` of a bitmap.
fn set_bits(w: usize, mut word: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (word != 0).then(|| {
            let b = word.trailing_zeros() as usize;
            word &= word - 1;
            w * 32 + b
        })
    })
}

/// Σ scalars_i · bases_i computed as batch addition over the ones plus an MSM over the
/// others. `bases` may be fewer or more than the scalars: a scalar past the bases is
/// ignored, as are extra bases (arkworks' `msm_bigint` does likewise).
pub fn msm_split<G>(bases: &[G::MulBase], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    msm_ones::<G>(bases, classes) + msm_others::<G>(bases, classes)
}

/// The ones' part of [`msm_split`] alone: Σ bases_i over the scalars equal to one (the
/// batch addition a device runs).
pub fn msm_ones<G>(bases: &[G::MulBase], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    // In parallel: a boolean circuit has about n/2 ones, and one core's sequential G2
    // fold was the CPU critical path at 2^22 (3.7 s per partition).
    (classes.ones.par_iter().enumerate())
        .flat_map_iter(|(w, &word)| set_bits(w, word))
        .filter_map(|i| bases.get(i))
        .fold(G::zero, |acc, base| acc + base)
        .reduce(G::zero, |a, b| a + b)
}

/// The others' part of [`msm_split`] alone: Σ scalars_i · bases_i over the scalars that
/// are neither 0 nor 1 (for when the ones were summed elsewhere, e.g. on the device).
pub fn msm_others<G>(bases: &[G::MulBase], classes: &ScalarClasses) -> G
where
    G: VariableBaseMSM<ScalarField = Fr>,
{
    let (b, s): (Vec<G::MulBase>, Vec<_>) = (classes.other_indices.iter())
        .zip(&classes.other_scalars)
        .filter_map(|(&i, s)| Some((*bases.get(i as usize)?, s.into_bigint())))
        .unzip();
    G::msm_bigint(&b, &s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_bls12_381::{G1Affine, G1Projective as G1};
    use ark_std::UniformRand;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    impl ScalarClasses {
        /// The ones' indices, ascending.
        fn ones(&self) -> impl Iterator<Item = usize> + '_ {
            (self.ones.iter().enumerate()).flat_map(|(w, &word)| set_bits(w, word))
        }
        fn suffix(&self, start: usize) -> ScalarClasses {
            let mut out = ScalarClasses::default();
            self.suffix_into(start, &mut out);
            out
        }
    }

    /// n scalars, each 0, 1 or random with the given weights.
    fn mixed(rng: &mut impl Rng, n: usize, weights: [u32; 3]) -> Vec<Fr> {
        let total = weights.iter().sum::<u32>().max(1);
        (0..n)
            .map(|_| match rng.gen_range(0..total) {
                x if x < weights[0] => Fr::zero(),
                x if x < weights[0] + weights[1] => Fr::one(),
                _ => Fr::rand(rng),
            })
            .collect()
    }

    /// The classes by definition, one scalar at a time.
    fn check(classes: &ScalarClasses, scalars: &[Fr]) {
        let n = scalars.len();
        assert_eq!(classes.len(), n);
        assert_eq!(classes.ones_words().len(), n.div_ceil(32));
        let ones: Vec<usize> = (0..n).filter(|&i| scalars[i].is_one()).collect();
        assert_eq!(classes.ones().collect::<Vec<_>>(), ones);
        assert_eq!(classes.ones_count(), ones.len());
        let others: Vec<(u32, Fr)> = (scalars.iter().enumerate())
            .filter(|(_, s)| !s.is_zero() && !s.is_one())
            .map(|(i, s)| (i as u32, *s))
            .collect();
        let got: Vec<(u32, Fr)> = (classes.other_indices().iter().copied())
            .zip(classes.other_scalars().iter().copied())
            .collect();
        assert_eq!(got, others);
        assert_eq!(classes.zeros() + ones.len() + others.len(), n);
    }

    #[test]
    fn split_equals_plain_msm_on_mixed_scalars() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [0usize, 1, 2, 31, 33, 100] {
            let bases: Vec<G1Affine> = (0..n).map(|_| G1Affine::rand(&mut rng)).collect();
            let scalars = mixed(&mut rng, n, [1, 1, 1]);
            let classes = ScalarClasses::classify(&scalars);
            check(&classes, &scalars);
            assert_eq!(
                msm_split::<G1>(&bases, &classes),
                G1::msm(&bases, &scalars).unwrap()
            );
            // Fewer bases than scalars: the scalars past them are ignored.
            let short = &bases[..n / 2];
            assert_eq!(
                msm_split::<G1>(short, &classes),
                G1::msm(short, &scalars[..n / 2]).unwrap()
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
        assert_eq!(c.len(), 3);
        assert_eq!(c.ones().collect::<Vec<_>>(), vec![1]);
        assert_eq!(c.other_indices(), &[2]);
        assert_eq!(c.other_scalars(), &[Fr::from(9u64)]);
        assert_eq!(
            ScalarClasses::classify(&s).suffix(9),
            ScalarClasses::classify(&[])
        );
    }

    #[test]
    fn classify_into_reuses_without_leftovers() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let mut classes = ScalarClasses::classify(&mixed(&mut rng, 1000, [1, 1, 1]));
        for n in [70, 0, 333] {
            let scalars = mixed(&mut rng, n, [2, 3, 1]);
            classes.classify_into(&scalars);
            assert_eq!(classes, ScalarClasses::classify(&scalars));
            check(&classes, &scalars);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The suffix (the L query's classes, shifted bitmap) equals a classification of
        /// the suffix's scalars, for starts on and off word boundaries.
        #[test]
        fn suffix_equals_classifying_the_suffix(
            n in 0usize..300,
            start in 0usize..320,
            seed in any::<u64>(),
            weights in prop::array::uniform3(0u32..4),
        ) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let scalars = mixed(&mut rng, n, weights);
            let classes = ScalarClasses::classify(&scalars);
            check(&classes, &scalars);
            let tail = scalars.get(start..).unwrap_or(&[]);
            prop_assert_eq!(classes.suffix(start), ScalarClasses::classify(tail));
        }
    }
}
