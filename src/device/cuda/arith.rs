//! Host wrappers of the elementwise test kernels in `cuda/arith.cu`, and the Fr-mul
//! rate probe the NTT benchmark reports as its compute floor.
//!
//! Each wrapper uploads its inputs, poisons the output (0xA5 bytes, so an index the
//! kernel skips is caught), launches one thread per element, synchronizes with the
//! error check, and downloads. Outputs are raw device values: callers decode them with
//! the checked functions of [`super::layout`], which refuse unreduced limbs.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, PushKernelArg, ValidAsZeroBits};

use super::context::{grid_1d, CudaError, Gpu};
use super::layout::{DevFq, DevFq2, DevFr, DevG1Affine, DevG1Xyzz};

/// The module built from `cuda/arith.cu`.
pub const MODULE: &str = "arith";

/// Threads per block of the elementwise kernels.
const BLOCK: u32 = 128;

/// The field an elementwise kernel works in, which picks its name's prefix in
/// `cuda/arith.cu` (that of the device type: `fr_t`, `fp_t`, `fp2_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// The scalar field (`fr_*`).
    Fr,
    /// The base field (`fp_*`).
    Fq,
    /// Fq(u) with u² = −1, the base field of G2 (`fp2_*`).
    Fq2,
}

/// An elementwise field operation; unary ones ignore `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldOp {
    Add,
    Sub,
    Neg,
    Dbl,
    Mul,
    Sqr,
    /// a^-1, with 0 ↦ 0.
    Inverse,
    /// one if a == b else zero (Montgomery one / zero).
    Eq,
    /// one if a == 0 else zero.
    IsZero,
}

impl FieldOp {
    pub const ALL: [FieldOp; 9] = [
        FieldOp::Add,
        FieldOp::Sub,
        FieldOp::Neg,
        FieldOp::Dbl,
        FieldOp::Mul,
        FieldOp::Sqr,
        FieldOp::Inverse,
        FieldOp::Eq,
        FieldOp::IsZero,
    ];

    /// The kernel's name in `field` (`fr_*`, `fp_*` or `fp2_*`).
    pub fn kernel(self, field: FieldKind) -> &'static str {
        macro_rules! pick {
            ($op:literal) => {
                match field {
                    FieldKind::Fr => concat!("fr_", $op),
                    FieldKind::Fq => concat!("fp_", $op),
                    FieldKind::Fq2 => concat!("fp2_", $op),
                }
            };
        }
        match self {
            FieldOp::Add => pick!("add"),
            FieldOp::Sub => pick!("sub"),
            FieldOp::Neg => pick!("neg"),
            FieldOp::Dbl => pick!("dbl"),
            FieldOp::Mul => pick!("mul"),
            FieldOp::Sqr => pick!("sqr"),
            FieldOp::Inverse => pick!("inverse"),
            FieldOp::Eq => pick!("eq"),
            FieldOp::IsZero => pick!("is_zero"),
        }
    }
}

/// Kernel names of the G1 operations (`cuda/arith.cu`).
pub mod g1_kernel {
    /// xyzz + xyzz
    pub const ADD: &str = "g1_add";
    /// xyzz + affine
    pub const ADD_AFFINE: &str = "g1_add_affine";
    /// xyzz − affine
    pub const SUB_AFFINE: &str = "g1_sub_affine";
    /// 2·xyzz
    pub const DBL: &str = "g1_dbl";
    /// 2·affine → xyzz
    pub const DBL_AFFINE: &str = "g1_dbl_affine";
    /// −xyzz
    pub const NEG: &str = "g1_neg";
    /// −affine
    pub const AFFINE_NEG: &str = "g1_affine_neg";
    pub const AFFINE_TO_XYZZ: &str = "g1_affine_to_xyzz";
    pub const XYZZ_TO_AFFINE: &str = "g1_xyzz_to_affine";
}

const FR_BATCH_INVERSE: &str = "fr_batch_inverse";
const FR_MUL_RATE: &str = "fr_mul_rate";

/// Runs `kernel(out, a, b, n)` over `a.len()` elements. `b` must be as long as `a`.
fn elementwise<O, A, B>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    kernel: &'static str,
    a: &[A],
    b: &[B],
) -> Result<Vec<O>, CudaError>
where
    O: DeviceRepr + ValidAsZeroBits + Clone + Default,
    A: DeviceRepr,
    B: DeviceRepr,
{
    if a.len() != b.len() {
        return Err(CudaError::InvalidInput(format!(
            "{kernel}: operands of {} and {} elements",
            a.len(),
            b.len()
        )));
    }
    let n = a.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let f = gpu.function(MODULE, kernel)?;
    let a_dev = stream.clone_htod(a)?;
    let b_dev = stream.clone_htod(b)?;
    // SAFETY: poisoned right below, and every element is written by the kernel
    // (or the test sees the poison).
    let mut out = unsafe { stream.alloc::<O>(n) }?;
    gpu.poison(stream, &mut out)?;
    let n64 = n as u64;
    let mut args = stream.launch_builder(&f);
    args.arg(&mut out).arg(&a_dev).arg(&b_dev).arg(&n64);
    // SAFETY: matches `kernel(T_OUT*, const T_A*, const T_B*, size_t)`; the buffers
    // live until after the sync below.
    unsafe { gpu.launch(kernel, &mut args, grid_1d(n, BLOCK)?) }?;
    gpu.sync(stream, kernel)?;
    let host = stream.clone_dtoh(&out)?;
    gpu.sync(stream, kernel)?;
    Ok(host)
}

/// A device field element type, with elementwise kernels in `cuda/arith.cu`.
pub trait DeviceField: DeviceRepr + ValidAsZeroBits + Clone + Default {
    const FIELD: FieldKind;
}
impl DeviceField for DevFr {
    const FIELD: FieldKind = FieldKind::Fr;
}
impl DeviceField for DevFq {
    const FIELD: FieldKind = FieldKind::Fq;
}
impl DeviceField for DevFq2 {
    const FIELD: FieldKind = FieldKind::Fq2;
}

/// Elementwise operation in `T`'s field (unary operations ignore `b`; pass `a` again).
pub fn field_op<T: DeviceField>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    op: FieldOp,
    a: &[T],
    b: &[T],
) -> Result<Vec<T>, CudaError> {
    elementwise(gpu, stream, op.kernel(T::FIELD), a, b)
}

/// `p[i] + q[i]` (full XYZZ addition).
pub fn g1_add(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
    q: &[DevG1Xyzz],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::ADD, p, q)
}
/// `p[i] + q[i]` (mixed addition).
pub fn g1_add_affine(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
    q: &[DevG1Affine],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::ADD_AFFINE, p, q)
}
/// `p[i] − q[i]` (mixed).
pub fn g1_sub_affine(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
    q: &[DevG1Affine],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::SUB_AFFINE, p, q)
}
/// `2·p[i]`.
pub fn g1_dbl(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::DBL, p, p)
}
/// `2·p[i]` for affine input.
pub fn g1_dbl_affine(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Affine],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::DBL_AFFINE, p, p)
}
/// `−p[i]`.
pub fn g1_neg(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::NEG, p, p)
}
/// `−p[i]` for affine points.
pub fn g1_affine_neg(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Affine],
) -> Result<Vec<DevG1Affine>, CudaError> {
    elementwise(gpu, s, g1_kernel::AFFINE_NEG, p, p)
}
/// Affine → XYZZ on the device.
pub fn g1_affine_to_xyzz(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Affine],
) -> Result<Vec<DevG1Xyzz>, CudaError> {
    elementwise(gpu, s, g1_kernel::AFFINE_TO_XYZZ, p, p)
}
/// XYZZ → affine on the device (two inversions per point).
pub fn g1_xyzz_to_affine(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    p: &[DevG1Xyzz],
) -> Result<Vec<DevG1Affine>, CudaError> {
    elementwise(gpu, s, g1_kernel::XYZZ_TO_AFFINE, p, p)
}

/// Inverts `a` with the device `batch_inverse` helper, one run of `chunk` elements per
/// thread (zeros map to zero).
pub fn fr_batch_inverse(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    a: &[DevFr],
    chunk: usize,
) -> Result<Vec<DevFr>, CudaError> {
    if chunk == 0 {
        return Err(CudaError::InvalidInput("batch inverse chunk of 0".into()));
    }
    let n = a.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let f = gpu.function(MODULE, FR_BATCH_INVERSE)?;
    let a_dev = stream.clone_htod(a)?;
    // SAFETY: poisoned below; every element is written or the poison shows.
    let mut out = unsafe { stream.alloc::<DevFr>(n) }?;
    gpu.poison(stream, &mut out)?;
    let (n64, chunk64) = (n as u64, chunk as u64);
    let mut args = stream.launch_builder(&f);
    args.arg(&mut out).arg(&a_dev).arg(&n64).arg(&chunk64);
    // SAFETY: matches `fr_batch_inverse(fr_t*, const fr_t*, size_t, size_t)`.
    unsafe {
        gpu.launch(
            FR_BATCH_INVERSE,
            &mut args,
            grid_1d(n.div_ceil(chunk), BLOCK)?,
        )
    }?;
    gpu.sync(stream, FR_BATCH_INVERSE)?;
    let host = stream.clone_dtoh(&out)?;
    gpu.sync(stream, FR_BATCH_INVERSE)?;
    Ok(host)
}

/// Launches the rate probe with `iters` rounds per thread on `stream` and returns at
/// once: about `iters · 2 · sm_count · 2048` Fr products keep the stream busy, for tests
/// that need a stream held behind work. The returned buffer must live until the stream
/// has run the kernel.
pub fn hold_stream(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    iters: u32,
) -> Result<CudaSlice<DevFr>, CudaError> {
    let threads = gpu.sm_count()? as usize * 2048;
    let f = gpu.function(MODULE, FR_MUL_RATE)?;
    let mut data = stream.alloc_zeros::<DevFr>(threads)?;
    let n64 = threads as u64;
    let mut args = stream.launch_builder(&f);
    args.arg(&mut data).arg(&n64).arg(&iters);
    // SAFETY: matches `fr_mul_rate(fr_t*, size_t, uint32_t)`; zeros are valid elements.
    unsafe { gpu.launch(FR_MUL_RATE, &mut args, grid_1d(threads, 256)?) }?;
    Ok(data)
}

/// Measured Fr multiplication throughput of the whole device, in multiplications
/// per second (median of `runs` event-timed launches after a warm-up).
pub fn fr_mul_rate(gpu: &Gpu, stream: &Arc<CudaStream>, runs: usize) -> Result<f64, CudaError> {
    const ITERS: u32 = 256;
    let threads = gpu.sm_count()? as usize * 2048;
    let f = gpu.function(MODULE, FR_MUL_RATE)?;
    let mut data = stream.alloc_zeros::<DevFr>(threads)?;
    // 0x11 bytes: a reduced value (below r's top byte 0x73), non-trivial limbs.
    let (ptr, rec) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut data, stream);
    // SAFETY: fills the live buffer on its stream.
    unsafe {
        cudarc::driver::result::memset_d8_async(ptr, 0x11, threads * 32, stream.cu_stream())
    }?;
    drop(rec);
    let n64 = threads as u64;
    let cfg = grid_1d(threads, 256)?;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs.max(1) + 1 {
        let ms = super::ntt::time_on_stream(gpu, stream, || {
            let mut args = stream.launch_builder(&f);
            args.arg(&mut data).arg(&n64).arg(&ITERS);
            // SAFETY: matches `fr_mul_rate(fr_t*, size_t, uint32_t)`.
            unsafe { gpu.launch(FR_MUL_RATE, &mut args, cfg) }
        })?;
        if run > 0 {
            times.push(ms);
        }
    }
    gpu.sync(stream, FR_MUL_RATE)?;
    let ms = super::ntt::median(&mut times);
    Ok(threads as f64 * f64::from(ITERS) * 2.0 / (ms / 1e3))
}
