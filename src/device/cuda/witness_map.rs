//! The witness map on the device: h from the evaluations a = A·z, b = B·z, c = C·z,
//! exactly as ark-groth16 0.6 `LibsnarkReduction::witness_map_from_matrices` computes
//! it after evaluation (domain D = `Radix2EvaluationDomain<Fr>` of size n, coset gD
//! with g = `Fr::GENERATOR`):
//!
//! 1. a, b, c ← D.ifft(·), then gD.fft(·) (the ifft's n^-1 and the coset's g^i are
//!    fused into one bit-reversal pass);
//! 2. a ← (a·b − c) · Z(g)^-1, where Z(g) = g^n − 1 is the vanishing polynomial of D on
//!    the coset (a constant);
//! 3. a ← gD.ifft(a), with b as the transform's scratch.
//!
//! h (n coefficients, as arkworks returns) is left in `a`; `b` is overwritten and `c`
//! holds its coset evaluations. All work is enqueued on `stream`; the
//! call returns before it completes.

use std::sync::Arc;

use ark_ff::{FftField, Field};
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};
use cudarc::driver::{CudaStream, DevicePtrMut, PushKernelArg};

use super::context::{grid_1d, CudaError, Gpu};
use super::layout::{fr_to_dev, DevFr};
use super::ntt::{self, kernel, NttKind, MODULE};
use crate::Fr;

/// Z(g)^-1 = 1 / (g^n − 1) for the domain of size n, as arkworks computes it.
pub fn vanishing_inverse_on_coset(n: usize) -> Result<Fr, CudaError> {
    let domain = Radix2EvaluationDomain::<Fr>::new(n)
        .filter(|d| d.size() == n)
        .ok_or_else(|| CudaError::InvalidInput(format!("no radix-2 domain of size {n}")))?;
    domain
        .evaluate_vanishing_polynomial(Fr::GENERATOR)
        .inverse()
        .ok_or_else(|| CudaError::InvalidInput("Z(g) = 0".into()))
}

/// h ← witness map of (a, b, c), left in `a` (see the module docs). The three buffers
/// must have the same power-of-two length n (the QAP domain size, 2..=2^28) and
/// must not alias.
pub fn witness_map<A, B, C>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    a: &mut A,
    b: &mut B,
    c: &mut C,
) -> Result<(), CudaError>
where
    A: DevicePtrMut<DevFr>,
    B: DevicePtrMut<DevFr>,
    C: DevicePtrMut<DevFr>,
{
    let n = a.len();
    if b.len() != n || c.len() != n {
        return Err(CudaError::InvalidInput(format!(
            "witness map: a, b, c have {}, {}, {} elements",
            n,
            b.len(),
            c.len()
        )));
    }
    if !n.is_power_of_two() || n < 2 || n.trailing_zeros() > ntt::MAX_LOG_N {
        return Err(CudaError::InvalidInput(format!(
            "witness map: domain size {n}"
        )));
    }
    let log_n = n.trailing_zeros();
    let z_inv = fr_to_dev(&vanishing_inverse_on_coset(n)?);
    let divide = gpu.function(MODULE, kernel::QAP_DIVIDE)?;

    let (pa, _ra) = a.device_ptr_mut(stream);
    let (pb, _rb) = b.device_ptr_mut(stream);
    let (pc, _rc) = c.device_ptr_mut(stream);
    if pa == pb || pa == pc || pb == pc {
        return Err(CudaError::InvalidInput("witness map: a, b, c alias".into()));
    }
    // SAFETY: each pointer addresses n live scalars of its own buffer, borrowed
    // mutably for this call; all work is ordered on `stream` and the cudarc records
    // (`_ra`, …) are kept until everything is enqueued.
    unsafe {
        for p in [pa, pb, pc] {
            ntt::ifft_then_coset_fft_raw(gpu, stream, p, log_n)?;
        }
        let n64 = n as u64;
        let mut args = stream.launch_builder(&divide);
        args.arg(&pa).arg(&pb).arg(&pc).arg(&z_inv).arg(&n64);
        gpu.launch(kernel::QAP_DIVIDE, &mut args, grid_1d(n, 256)?)?;
        // b is free once the quotient is in a: the last transform uses it as its
        // scratch and writes h in natural order with no separate bit-reversal pass.
        ntt::transform_raw(
            gpu,
            stream,
            pa,
            log_n,
            ntt::Steps::of_kind(NttKind::CosetInverse),
            Some(pb),
        )?;
    }
    Ok(())
}

/// The same computation on the CPU with ark-poly, step for step as ark-groth16 does
/// it (the reference the GPU tests compare against).
pub fn witness_map_cpu(a: &[Fr], b: &[Fr], c: &[Fr]) -> Result<Vec<Fr>, CudaError> {
    let n = a.len();
    let domain = Radix2EvaluationDomain::<Fr>::new(n)
        .filter(|d| d.size() == n && b.len() == n && c.len() == n)
        .ok_or_else(|| {
            CudaError::InvalidInput(format!("witness map: sizes {n}, {}, {}", b.len(), c.len()))
        })?;
    let coset = domain
        .get_coset(Fr::GENERATOR)
        .ok_or_else(|| CudaError::InvalidInput("no coset".into()))?;
    let (mut a, mut b, mut c) = (a.to_vec(), b.to_vec(), c.to_vec());
    domain.ifft_in_place(&mut a);
    domain.ifft_in_place(&mut b);
    coset.fft_in_place(&mut a);
    coset.fft_in_place(&mut b);
    let mut ab = domain.mul_polynomials_in_evaluation_domain(&a, &b);
    domain.ifft_in_place(&mut c);
    coset.fft_in_place(&mut c);
    let z_inv = vanishing_inverse_on_coset(n)?;
    for (x, ci) in ab.iter_mut().zip(&c) {
        *x -= ci;
        *x *= z_inv;
    }
    coset.ifft_in_place(&mut ab);
    Ok(ab)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::UniformRand;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    /// The CPU reference equals h computed through the definition: h·Z = a·b − c as
    /// polynomials (a, b, c interpolated over D), checked at a random point.
    #[test]
    fn witness_map_cpu_reference_is_the_quotient() {
        use ark_poly::{univariate::DensePolynomial, DenseUVPolynomial, Polynomial};
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for log_n in [1u32, 3, 6] {
            let n = 1usize << log_n;
            let domain = Radix2EvaluationDomain::<Fr>::new(n).unwrap();
            let rnd = |rng: &mut ChaCha20Rng| (0..n).map(|_| Fr::rand(rng)).collect::<Vec<_>>();
            let (a, b) = (rnd(&mut rng), rnd(&mut rng));
            // Choose c = a·b on D so that a·b − c vanishes on D and h is exact.
            let c: Vec<Fr> = a.iter().zip(&b).map(|(x, y)| *x * y).collect();
            let h = witness_map_cpu(&a, &b, &c).unwrap();
            let interp = |v: &[Fr]| DensePolynomial::from_coefficients_vec(domain.ifft(v));
            let (pa, pb, pc) = (interp(&a), interp(&b), interp(&c));
            let ph = DensePolynomial::from_coefficients_vec(h);
            let x = Fr::rand(&mut rng);
            let lhs = ph.evaluate(&x) * domain.evaluate_vanishing_polynomial(x);
            let rhs = pa.evaluate(&x) * pb.evaluate(&x) - pc.evaluate(&x);
            assert_eq!(lhs, rhs, "n = {n}");
        }
    }
}
