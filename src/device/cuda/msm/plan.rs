//! Window plans and the signed-digit recoding (the CPU model of stage (a)'s digits).

use super::*;

/// Window width c and count W of one MSM, c·W ≥ 256 > log2(r) + 1: signed digits
/// d_w ∈ [−(2^(c−1) − 1), 2^(c−1)], k = Σ d_w 2^(cw), no carry out of the top window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct WindowPlan {
    pub c: u32,
    pub windows: u32,
}

impl WindowPlan {
    pub fn with_bits(c: u32) -> WindowPlan {
        WindowPlan {
            c,
            windows: 256u32.div_ceil(c),
        }
    }
    /// [`WindowPlan::with_bits`] for c in [`MIN_WINDOW_BITS`]..=[`MAX_WINDOW_BITS`],
    /// an error otherwise.
    pub fn checked(c: u32) -> Result<WindowPlan, CudaError> {
        if !(MIN_WINDOW_BITS..=MAX_WINDOW_BITS).contains(&c) {
            return Err(invalid(format!(
                "window width {c} outside {MIN_WINDOW_BITS}..={MAX_WINDOW_BITS}"
            )));
        }
        Ok(WindowPlan::with_bits(c))
    }
    /// The c minimising W(c)·(10·n + 14·2^c), a mixed addition (10 multiplications) per
    /// digit and two full additions (14 each) per bucket in the reduction, up to a
    /// measured cap: [`MAX_PLANNED_WINDOW_BITS`], or [`WIDE_PLANNED_WINDOW_BITS`] from
    /// [`WIDE_WINDOW_MIN_LEN`] scalars up.
    pub fn for_len(n: usize) -> WindowPlan {
        let cap = if n >= WIDE_WINDOW_MIN_LEN {
            WIDE_PLANNED_WINDOW_BITS
        } else {
            MAX_PLANNED_WINDOW_BITS
        };
        let cost = |c: u32| u128::from(256u32.div_ceil(c)) * (10 * n as u128 + (14u128 << c));
        let best = (MIN_WINDOW_BITS..=cap).min_by_key(|&c| (cost(c), c));
        WindowPlan::with_bits(best.unwrap_or(cap))
    }
    /// Buckets per window: digit magnitudes 1..=2^(c−1).
    pub fn buckets(&self) -> usize {
        1 << (self.c - 1)
    }
}

/// CPU model of the device recoding (`msm::digits`): the W signed c-bit digits of a
/// canonical scalar k < 2^255, least significant first; k = Σ d_w 2^(cw).
pub fn signed_digits(k: &[u64; 4], plan: WindowPlan) -> Vec<i64> {
    let c = plan.c;
    let bit = |i: u32| {
        if i < 256 {
            (k[i as usize / 64] >> (i % 64)) as i64 & 1
        } else {
            0
        }
    };
    let mut carry = 0;
    (0..plan.windows)
        .map(|w| {
            let v = (0..c).map(|i| bit(w * c + i) << i).sum::<i64>() + carry;
            carry = i64::from(v > 1 << (c - 1));
            v - (carry << c)
        })
        .collect()
}

/// A digit as the device stores it: bit 31 = negative, the low bits = magnitude.
pub fn encode_digit(d: i64) -> u32 {
    d.unsigned_abs() as u32 | u32::from(d < 0) << 31
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::{BigInteger, Field, One, PrimeField};

    fn reconstruct(d: &[i64], c: u32) -> Fr {
        let base = Fr::from(2u64).pow([u64::from(c)]);
        let fr = |x: i64| {
            if x < 0 {
                -Fr::from(x.unsigned_abs())
            } else {
                Fr::from(x as u64)
            }
        };
        d.iter()
            .rev()
            .fold(Fr::zero(), |acc, &x| acc * base + fr(x))
    }

    #[test]
    fn msm_plan_covers_256_bits() {
        for n in [
            0usize,
            1,
            2,
            31,
            1 << 10,
            1 << 16,
            1 << 20,
            1 << 24,
            1 << 26,
            1 << 28,
        ] {
            let p = WindowPlan::for_len(n);
            assert!(
                (MIN_WINDOW_BITS..=MAX_WINDOW_BITS).contains(&p.c),
                "{n}: {p:?}"
            );
            assert!(
                p.c * p.windows >= 256 && p.c * (p.windows - 1) < 256,
                "{n}: {p:?}"
            );
            assert!(p.windows as usize <= MAX_WINDOWS);
        }
        // Capped at MAX_PLANNED_WINDOW_BITS from 2^20 to just below 2^26 (the model
        // alone picks 18 at 2^22 and 20 at 2^24), at WIDE_PLANNED_WINDOW_BITS from there.
        for n in [1 << 20, 1 << 22, 1 << 24, (1 << 26) - 1] {
            assert_eq!(WindowPlan::for_len(n).c, MAX_PLANNED_WINDOW_BITS, "{n}");
        }
        for log in [26, 27, 28] {
            assert_eq!(WindowPlan::for_len(1 << log).c, WIDE_PLANNED_WINDOW_BITS);
        }
        assert!(WindowPlan::for_len(1 << 16).c < WindowPlan::for_len(1 << 22).c);
        assert!(WindowPlan::checked(MIN_WINDOW_BITS - 1).is_err());
        assert!(WindowPlan::checked(MAX_WINDOW_BITS + 1).is_err());
        assert_eq!(WindowPlan::checked(18).unwrap(), WindowPlan::with_bits(18));
    }

    #[test]
    fn msm_signed_digits_reconstruct() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let mut ks: Vec<Fr> = (0..200).map(|_| Fr::rand(&mut rng)).collect();
        ks.extend([Fr::zero(), Fr::one(), -Fr::one(), Fr::from(2u64).pow([254])]);
        for c in MIN_WINDOW_BITS..=MAX_WINDOW_BITS {
            let (plan, half) = (WindowPlan::with_bits(c), 1i64 << (c - 1));
            for k in &ks {
                let d = signed_digits(&k.into_bigint().0, plan);
                assert!(d.iter().all(|&x| -half < x && x <= half), "c={c}");
                assert_eq!(reconstruct(&d, c), *k, "c={c}");
            }
        }
    }

    #[test]
    fn msm_digits_at_the_boundary_carry() {
        // Every window 2^(c-1): positive, no carry. 2^(c-1) + 1 and 2^c - 1 in every
        // window: negative digits with a carry into every next window.
        for c in [4u32, 13, 16, 20] {
            let plan = WindowPlan::with_bits(c);
            for v in [1u64 << (c - 1), (1u64 << (c - 1)) + 1, (1u64 << c) - 1] {
                let mut k = ark_ff::BigInt::<4>::zero();
                for w in (0..plan.windows).map(|w| w * c).filter(|b| b + c <= 254) {
                    let mut t = ark_ff::BigInt::<4>::from(v);
                    t <<= w;
                    k.add_with_carry(&t);
                }
                let d = signed_digits(&k.0, plan);
                assert_eq!(
                    reconstruct(&d, c),
                    Fr::from_bigint(k).unwrap(),
                    "c={c} v={v}"
                );
                assert!(d.iter().all(|&x| x.unsigned_abs() <= 1 << (c - 1)));
                assert_eq!(v > 1 << (c - 1), d.iter().any(|&x| x < 0), "c={c} v={v}");
            }
        }
    }

    #[test]
    fn msm_encode_digit() {
        assert_eq!(
            (encode_digit(0), encode_digit(5), encode_digit(-5)),
            (0, 5, 5 | 1 << 31)
        );
    }
}
