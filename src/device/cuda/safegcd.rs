//! Host tests of the device's modular inversion (`cuda/safegcd.cuh`, plain C++ that
//! build.rs also compiles for the host): every `inverse()` in the kernels goes through
//! it, so it is checked here against arkworks without a GPU, on the integers it sees
//! (a field element's Montgomery limbs, inverted as an integer modulo q or r).

#[cfg(test)]
mod tests {
    use ark_ff::{BigInteger, PrimeField};
    use rand::SeedableRng;

    extern "C" {
        fn twolock_safegcd_inverse(out: *mut u32, x: *const u32, m: *const u32, words: i32)
            -> bool;
    }

    fn words<B: BigInteger>(b: &B) -> Vec<u32> {
        b.as_ref()
            .iter()
            .flat_map(|l| [*l as u32, (*l >> 32) as u32])
            .collect()
    }

    /// x^-1 mod p of the integer x < p by the C++ routine, as a field element
    /// (None: it reported failure).
    fn device_inverse<F: PrimeField>(x: &F::BigInt) -> Option<F> {
        let (input, modulus) = (words(x), words(&F::MODULUS));
        let mut out = vec![0u32; input.len()];
        let n = i32::try_from(input.len()).ok()?;
        // SAFETY: all three hold the field's `n` words.
        let ok = unsafe {
            twolock_safegcd_inverse(out.as_mut_ptr(), input.as_ptr(), modulus.as_ptr(), n)
        };
        let mut limbs = F::BigInt::default();
        for (i, l) in limbs.as_mut().iter_mut().enumerate() {
            *l = u64::from(out[2 * i]) | u64::from(out[2 * i + 1]) << 32;
        }
        ok.then(|| F::from_bigint(limbs)).flatten()
    }

    fn check<F: PrimeField>(name: &str) {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(30);
        let mut xs: Vec<F> = (0..2000).map(|_| F::rand(&mut rng)).collect();
        xs.extend([0u64, 1, 2, 3, 4].map(F::from));
        xs.extend([1u64, 2, 3].map(|k| -F::from(k)));
        xs.extend(
            (0..F::MODULUS_BIT_SIZE)
                .step_by(7)
                .map(|b| F::from(2u64).pow([u64::from(b)])),
        );
        for x in xs {
            // The integer x itself (not its Montgomery form): x^-1 as an integer.
            let got = device_inverse::<F>(&x.into_bigint());
            let want = x.inverse().unwrap_or(F::ZERO);
            assert_eq!(got, Some(want), "{name}: inverse of {x}");
        }
    }

    #[test]
    fn safegcd_inverts_modulo_q() {
        check::<ark_bls12_381::Fq>("q");
    }

    #[test]
    fn safegcd_inverts_modulo_r() {
        check::<ark_bls12_381::Fr>("r");
    }
}
