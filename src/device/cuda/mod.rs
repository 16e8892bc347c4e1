//! The CUDA GPU (feature `cuda`): cudarc on the host, kernels from `cuda/` compiled by
//! build.rs into fatbins embedded in the binary.
//!
//! - [`context`]: [`Gpu`] (context, module cache, checked launches, allocations) and
//!   [`CudaError`];
//! - [`staging`]: host→device copies through a pool of page-locked buffers;
//! - [`layout`]: arkworks values ↔ the bytes the kernels read and write;
//! - [`arith`]: elementwise field and curve test kernels, and the Fr-mul rate probe;
//! - [`ntt`](mod@ntt): the four Fr transforms of `Radix2EvaluationDomain`, and their benchmark;
//! - [`witness_map`](mod@witness_map): h from a, b, c as ark-groth16's `LibsnarkReduction` computes it;
//! - `safegcd`: host tests of the kernels' field inversion (`cuda/safegcd.cuh`).
//!
//! Without a driver nothing here panics: [`Gpu::new`] returns [`CudaError::NoDriver`].

pub mod arith;
pub mod context;
pub mod g2;
pub mod layout;
pub mod msm;
pub mod ntt;
mod safegcd;
pub mod staging;
pub mod witness_map;

pub mod device;
pub use device::{CudaDevice, MeasuredFootprint, SqueezeLevel};

pub use context::{AllocKind, CudaError, DeviceBuffer, Gpu};
pub use layout::{DevFq, DevFr, DevG1Affine, DevG1Xyzz};
pub use ntt::{bench_ntt, ntt, ntt_with_scratch, NttKind, NttTiming};
pub use witness_map::witness_map;

/// The embedded kernels: one fatbin (sm_90 and sm_80 SASS, compute_90 PTX) per
/// `cuda/*.cu` file, named by the file's stem.
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}
