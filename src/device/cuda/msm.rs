//! G1 multi-scalar multiplication on the device: Σ k_i·P_i over BLS12-381 G1.
//!
//! - [`msm`]: Pippenger with signed c-bit windows for arbitrary scalars.
//! - [`batch_add`]: Σ P_i over a bitmap, for scalars equal to one.
//! - [`msm_split`]: the prover's split. The CPU prep classifies scalars into zero / one /
//!   other ([`classify`] → [`SplitScalars`]); the device adds the ones' bases by batch
//!   addition and runs Pippenger on the others only, reading their bases through the
//!   index list (the gather happens in the bucket sort: a sorted entry is the base's
//!   index, so no copy of the bases is made).
//!
//! Bases are affine and resident ([`DeviceBases`], uploaded once per key and device).
//! Scalars are arkworks `Fr` in Montgomery form, from the host or the device
//! ([`ScalarsRef`]); the first kernel converts them to canonical integers. An `Fr` is
//! always reduced (< r < 2^255), so no scalar ≥ r reaches the device, and the digit
//! recoding relies on that (the top window then absorbs the last carry). A device
//! buffer of Montgomery limbs that is not reduced is still mapped below r by the
//! conversion (it computes a·R⁻¹ mod r), so it cannot break the recoding either.
//!
//! Every stage is one kernel of `cuda/msm.cu` (see the pipeline in `cuda/msm.cuh`), and
//! [`stages`] runs each alone for the tests. The `*_enqueue` functions only enqueue on
//! the caller's stream and write a point into a caller's slot; [`read_points`] waits
//! (checked) and converts. The plain functions ([`msm`], [`batch_add`], [`msm_split`])
//! allocate a workspace, wait, and free it before they return. Every driver call and
//! launch returns its error; a result that is not a point of the curve is an error too.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use ark_bls12_381::{G1Affine, G1Projective};
use ark_ec::CurveGroup;
use ark_ff::{One, UniformRand, Zero};
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaEvent, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg};
use rand::SeedableRng;
use rayon::prelude::*;

use super::context::{grid_1d, AllocKind, CudaError, DeviceBuffer, Gpu};
use super::layout::{
    fr_as_dev, g1_affines_to_dev, xyzz_to_projective, DevFr, DevG1Affine, DevG1Xyzz,
};
use super::ntt::{median, time_on_stream};
use crate::device::ScalarClasses;
use crate::Fr;

/// The module built from `cuda/msm.cu`.
pub const MODULE: &str = "msm";
/// Kernel names in [`MODULE`], in pipeline order.
pub mod kernel {
    pub const FROM_MONTGOMERY: &str = "msm_from_montgomery";
    pub const DIGITS: &str = "msm_digits";
    pub const BUCKET_COUNT: &str = "msm_bucket_count";
    pub const SCAN_REDUCE: &str = "msm_scan_reduce";
    pub const SCAN_TILES: &str = "msm_scan_tiles";
    pub const SCAN_APPLY: &str = "msm_scan_apply";
    pub const BUCKET_SCATTER: &str = "msm_bucket_scatter";
    pub const ACCUMULATE_SORTED: &str = "msm_accumulate_sorted";
    pub const ACCUMULATE_HEADS: &str = "msm_accumulate_heads";
    pub const REDUCE_BUCKETS: &str = "msm_reduce_buckets";
    pub const SUM_CHUNKS: &str = "msm_sum_chunks";
    pub const COMBINE_WINDOWS: &str = "msm_combine_windows";
    pub const BATCH_ADD_BITMAP: &str = "msm_batch_add_bitmap";
}

/// Block sizes of msm.cu (`MSM_BLOCK_LIGHT`, `MSM_BLOCK_POINT`, `msm::SCAN_THREADS`).
const LIGHT_BLOCK: u32 = 256;
const POINT_BLOCK: u32 = 128;
const SCAN_THREADS: u32 = 256;
/// Counts per scan tile (`msm::SCAN_TILE`).
const SCAN_TILE: usize = 2048;
/// Window widths the planner picks from. c ≤ 20 keeps a window's 2^19 buckets at
/// 96 MiB; c ≥ 4 bounds the window count at 64.
pub const MIN_WINDOW_BITS: u32 = 4;
pub const MAX_WINDOW_BITS: u32 = 20;
/// Most accumulation slices (threads of `accumulate_sorted`); a workspace uses fewer
/// when fewer threads are resident on its GPU.
const MAX_SLICES: usize = 1 << 17;
/// Heads folded per thread and level; points summed per thread in `sum_chunks`.
const FOLD: u32 = 32;
/// Scalar positions and base indices must fit 31 bits (bit 31 is the sign).
pub const MAX_LEN: usize = (1 << 31) - 1;

/// Window width c and count W for one MSM, with c·W ≥ 256 > log2(r) + 1: signed
/// digits d_w ∈ [−(2^(c−1) − 1), 2^(c−1)] with k = Σ d_w 2^(cw) and no carry out of the
/// top window.
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
    /// The c minimising W(c)·(10·n + 14·2^c): mixed additions (10 multiplications each)
    /// of the accumulation plus two full additions (14) per bucket in the reduction.
    pub fn for_len(n: usize) -> WindowPlan {
        let cost = |c: u32| {
            let p = WindowPlan::with_bits(c);
            u128::from(p.windows) * (10 * n as u128 + 14 * (1u128 << c))
        };
        let c = (MIN_WINDOW_BITS..=MAX_WINDOW_BITS)
            .min_by_key(|&c| (cost(c), c))
            .unwrap_or(MAX_WINDOW_BITS);
        WindowPlan::with_bits(c)
    }
    /// Buckets per window: digit magnitudes 1..=2^(c−1).
    pub fn buckets(&self) -> usize {
        1 << (self.c - 1)
    }
}

/// CPU reference of the device recoding (`msm::digits`): the signed c-bit digits of a
/// canonical scalar k < 2^255, little-endian, W of them; k = Σ d_w 2^(cw).
pub fn signed_digits(k: &[u64; 4], plan: WindowPlan) -> Vec<i64> {
    let (c, half) = (plan.c, 1i64 << (plan.c - 1));
    let bits = |off: u32| -> i64 {
        (0..c)
            .filter(|i| off + i < 256)
            .map(|i| (((k[((off + i) / 64) as usize] >> ((off + i) % 64)) & 1) as i64) << i)
            .sum()
    };
    let mut carry = 0;
    (0..plan.windows)
        .map(|w| {
            let v = bits(w * c) + carry;
            carry = i64::from(v > half);
            v - (carry << c)
        })
        .collect()
}

/// A digit as the device stores it: bit 31 = negative, low bits = magnitude.
pub fn encode_digit(d: i64) -> u32 {
    (d.unsigned_abs() as u32) | if d < 0 { 1 << 31 } else { 0 }
}

/// Affine G1 bases resident on one device (`g1_affine_t`, infinity as (0, 0)).
#[derive(Debug)]
pub struct DeviceBases {
    buf: DeviceBuffer<DevG1Affine>,
    len: usize,
}

impl DeviceBases {
    /// Uploads `points` and waits until the copy has landed (the host staging is
    /// pageable: a kernel on another stream must not race it).
    pub fn upload(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        points: &[G1Affine],
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let host = g1_affines_to_dev(points);
        let buf = match kind {
            AllocKind::Sync => gpu.alloc_sync::<DevG1Affine>(stream, host.len())?,
            AllocKind::StreamOrdered => gpu.alloc_async::<DevG1Affine>(stream, host.len())?,
        };
        // SAFETY: `buf` holds host.len() points.
        unsafe { upload(gpu, stream, buf.raw(), &host) }?;
        gpu.sync(stream, "msm bases upload")?;
        Ok(DeviceBases {
            buf,
            len: points.len(),
        })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn bytes(&self) -> u64 {
        (self.len * std::mem::size_of::<DevG1Affine>()) as u64
    }
    pub fn view(&self) -> BasesView<'_> {
        BasesView {
            ptr: self.buf.raw(),
            len: self.len,
            _owner: PhantomData,
        }
    }
    /// Bases `range` (e.g. a query without its first element).
    pub fn slice(&self, range: Range<usize>) -> Result<BasesView<'_>, CudaError> {
        if range.start > range.end || range.end > self.len {
            return Err(CudaError::InvalidInput(format!(
                "bases {range:?} out of 0..{}",
                self.len
            )));
        }
        let ptr = self.buf.raw() + (range.start * std::mem::size_of::<DevG1Affine>()) as u64;
        Ok(BasesView {
            ptr,
            len: range.len(),
            _owner: PhantomData,
        })
    }
    /// Frees now (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        self.buf.free()
    }
}

/// A borrowed run of resident bases.
#[derive(Clone, Copy, Debug)]
pub struct BasesView<'a> {
    ptr: CUdeviceptr,
    len: usize,
    _owner: PhantomData<&'a DeviceBases>,
}

impl BasesView<'_> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'a> From<&'a DeviceBases> for BasesView<'a> {
    fn from(b: &'a DeviceBases) -> Self {
        b.view()
    }
}

/// Where the scalars are. All are arkworks Montgomery limbs (`DevFr`).
#[derive(Clone, Copy, Debug)]
pub enum ScalarsRef<'a> {
    /// Pageable host memory: the copy is staged, the slice is free when the call returns.
    Host(&'a [Fr]),
    /// Page-locked host memory, copied asynchronously in full (cudarc records the copy
    /// on the slice's event, so host access to it waits for the copy).
    Pinned(&'a PinnedHostSlice<DevFr>),
    /// Device memory written on (or ordered before) the stream the MSM runs on.
    Device(DeviceScalars<'a>),
}

impl ScalarsRef<'_> {
    pub fn len(&self) -> usize {
        match self {
            ScalarsRef::Host(s) => s.len(),
            ScalarsRef::Pinned(s) => s.len(),
            ScalarsRef::Device(d) => d.len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A borrowed run of device scalars.
#[derive(Clone, Copy, Debug)]
pub struct DeviceScalars<'a> {
    ptr: CUdeviceptr,
    len: usize,
    _owner: PhantomData<&'a ()>,
}

impl<'a> DeviceScalars<'a> {
    /// Scalars `range` of `buf`.
    pub fn new(buf: &'a DeviceBuffer<DevFr>, range: Range<usize>) -> Result<Self, CudaError> {
        if range.start > range.end || range.end > buf.len() {
            return Err(CudaError::InvalidInput(format!(
                "scalars {range:?} out of 0..{}",
                buf.len()
            )));
        }
        let ptr = buf.raw() + (range.start * std::mem::size_of::<DevFr>()) as u64;
        Ok(DeviceScalars {
            ptr,
            len: range.len(),
            _owner: PhantomData,
        })
    }
    /// # Safety
    /// `ptr` must address `len` `DevFr` (16-byte aligned) that stay allocated and
    /// unchanged until the MSM reading them has completed.
    pub unsafe fn from_raw(ptr: CUdeviceptr, len: usize) -> Self {
        DeviceScalars {
            ptr,
            len,
            _owner: PhantomData,
        }
    }
}

/// The CPU prep's split of MSM scalars: ones as a bitmap, the others (neither 0 nor 1)
/// as ascending indices with their scalars. Zeros appear in neither. The fields are
/// private so the indices are always < `len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitScalars {
    len: usize,
    /// Bit i (bit i % 32 of word i / 32) is set iff scalar i is one.
    ones: Vec<u32>,
    ones_count: usize,
    other_indices: Vec<u32>,
    other_scalars: Vec<Fr>,
}

/// Classifies `scalars` (in parallel) into zero / one / other.
pub fn classify(scalars: &[Fr]) -> SplitScalars {
    SplitScalars::classify(scalars)
}

impl SplitScalars {
    pub fn classify(scalars: &[Fr]) -> SplitScalars {
        let ones: Vec<u32> = scalars
            .par_chunks(32)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u32, |w, (b, s)| w | (u32::from(s.is_one()) << b))
            })
            .collect();
        let others: Vec<(u32, Fr)> = scalars
            .par_iter()
            .enumerate()
            .filter(|(_, s)| !s.is_zero() && !s.is_one())
            .map(|(i, s)| (i as u32, *s))
            .collect();
        let ones_count = ones.iter().map(|w| w.count_ones() as usize).sum();
        let (other_indices, other_scalars) = others.into_iter().unzip();
        SplitScalars {
            len: scalars.len(),
            ones,
            ones_count,
            other_indices,
            other_scalars,
        }
    }
    /// From the prep's [`ScalarClasses`] of `scalars` (no rescan of the zeros).
    pub fn from_classes(
        classes: &ScalarClasses,
        scalars: &[Fr],
    ) -> Result<SplitScalars, CudaError> {
        let len = classes.len;
        let bad = |i: &u32| (*i as usize) >= len || (*i as usize) >= scalars.len();
        if classes.ones.iter().chain(&classes.others).any(bad) || len > MAX_LEN {
            return Err(CudaError::InvalidInput(
                "scalar classes index past the scalars".into(),
            ));
        }
        let mut ones = vec![0u32; len.div_ceil(32)];
        for &i in &classes.ones {
            ones[i as usize / 32] |= 1 << (i % 32);
        }
        let other_scalars = classes
            .others
            .iter()
            .map(|&i| scalars[i as usize])
            .collect();
        let ones_count = classes.ones.len();
        Ok(SplitScalars {
            len,
            ones,
            ones_count,
            other_indices: classes.others.clone(),
            other_scalars,
        })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn ones_bitmap(&self) -> &[u32] {
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
    pub fn zeros_count(&self) -> usize {
        self.len - self.ones_count - self.other_indices.len()
    }
}

/// Element counts of a workspace's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sizes {
    max_n: usize,
    /// Digits and sorted entries: windows per pass × max_n.
    entries: usize,
    /// Buckets (and counts, offsets − 1): windows per pass × buckets per window.
    keys: usize,
    slices: usize,
    /// Reduction groups / batch-addition parts, and the first fold of those.
    partials: [usize; 2],
}

impl Sizes {
    fn new(max_n: usize, windows_per_pass: Option<u32>, slices: usize) -> Sizes {
        let plan = WindowPlan::for_len(max_n);
        let wg = windows_per_pass
            .unwrap_or(plan.windows)
            .clamp(1, plan.windows) as usize;
        let max_windows = 256usize.div_ceil(MIN_WINDOW_BITS as usize);
        Sizes {
            max_n,
            entries: wg * max_n,
            keys: wg * plan.buckets(),
            slices,
            partials: [
                slices.max(max_windows),
                slices.div_ceil(FOLD as usize) + max_windows,
            ],
        }
    }
    fn bytes(&self) -> u64 {
        let (xyzz, fr) = (
            std::mem::size_of::<DevG1Xyzz>(),
            std::mem::size_of::<DevFr>(),
        );
        let words = self.max_n * (fr / 4 + 1) + self.max_n.div_ceil(32) // scalars, index, bitmap
            + 2 * self.entries // digits, sorted
            + 2 * self.keys + 1 + self.keys.div_ceil(SCAN_TILE) // counts, offsets, tile sums
            + 2 * self.slices; // head keys
        let points = self.keys + 2 * self.slices + self.partials[0] + self.partials[1] + 64 + 1;
        (words * 4 + points * xyzz) as u64
    }
}

/// Device scratch of the MSMs of one stream, sized for up to `max_len` scalars. One
/// MSM at a time: the `*_enqueue` functions take it `&mut`, and the next use is ordered
/// after the previous on the same stream.
#[derive(Debug)]
pub struct MsmWorkspace {
    sizes: Sizes,
    scalars: DeviceBuffer<DevFr>,
    index: DeviceBuffer<u32>,
    bitmap: DeviceBuffer<u32>,
    digits: DeviceBuffer<u32>,
    sorted: DeviceBuffer<u32>,
    counts: DeviceBuffer<u32>,
    offsets: DeviceBuffer<u32>,
    tile_sums: DeviceBuffer<u32>,
    buckets: DeviceBuffer<DevG1Xyzz>,
    head_keys: [DeviceBuffer<u32>; 2],
    head_pts: [DeviceBuffer<DevG1Xyzz>; 2],
    partials: [DeviceBuffer<DevG1Xyzz>; 2],
    window_sums: DeviceBuffer<DevG1Xyzz>,
}

impl MsmWorkspace {
    /// All windows in one pass (fastest).
    pub fn new(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        max_len: usize,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::with_windows_per_pass(gpu, stream, max_len, None, kind)
    }
    /// `windows_per_pass` windows of a `max_len` MSM at a time (`None`: all), which
    /// bounds the digit, sort and bucket buffers: the small-card footprint.
    pub fn with_windows_per_pass(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        max_len: usize,
        windows_per_pass: Option<u32>,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        if max_len > MAX_LEN {
            return Err(CudaError::InvalidInput(format!(
                "MSM of {max_len} scalars exceeds {MAX_LEN}"
            )));
        }
        let f = gpu.function(MODULE, kernel::ACCUMULATE_SORTED)?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(POINT_BLOCK, 0, None)?
            .max(1);
        let resident = (gpu.sm_count()? * per_sm * POINT_BLOCK) as usize;
        let sizes = Sizes::new(max_len, windows_per_pass, resident.min(MAX_SLICES));
        fn alloc<T>(
            gpu: &Gpu,
            s: &Arc<CudaStream>,
            len: usize,
            kind: AllocKind,
        ) -> Result<DeviceBuffer<T>, CudaError> {
            match kind {
                AllocKind::Sync => gpu.alloc_sync(s, len),
                AllocKind::StreamOrdered => gpu.alloc_async(s, len),
            }
        }
        let a = |len: usize| alloc::<u32>(gpu, stream, len, kind);
        let p = |len: usize| alloc::<DevG1Xyzz>(gpu, stream, len, kind);
        Ok(MsmWorkspace {
            scalars: alloc(gpu, stream, sizes.max_n, kind)?,
            index: a(sizes.max_n)?,
            bitmap: a(sizes.max_n.div_ceil(32))?,
            digits: a(sizes.entries)?,
            sorted: a(sizes.entries)?,
            counts: a(sizes.keys)?,
            offsets: a(sizes.keys + 1)?,
            tile_sums: a(sizes.keys.div_ceil(SCAN_TILE))?,
            buckets: p(sizes.keys)?,
            head_keys: [a(sizes.slices)?, a(sizes.slices)?],
            head_pts: [p(sizes.slices)?, p(sizes.slices)?],
            partials: [p(sizes.partials[0])?, p(sizes.partials[1])?],
            window_sums: p(64)?,
            sizes,
        })
    }
    /// Device bytes of a workspace for `len` scalars, all windows in one pass (an upper
    /// bound: the accumulation slices are counted at their maximum).
    pub fn bytes_needed(len: usize) -> u64 {
        Self::bytes_needed_with(len, None)
    }
    pub fn bytes_needed_with(len: usize, windows_per_pass: Option<u32>) -> u64 {
        Sizes::new(len, windows_per_pass, MAX_SLICES).bytes()
    }
    pub fn bytes(&self) -> u64 {
        self.sizes.bytes()
    }
    pub fn max_len(&self) -> usize {
        self.sizes.max_n
    }
    /// Frees every buffer now, reporting the first error (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        let MsmWorkspace {
            scalars,
            index,
            bitmap,
            digits,
            sorted,
            counts,
            offsets,
            tile_sums,
            buckets,
            head_keys,
            head_pts,
            partials,
            window_sums,
            ..
        } = self;
        let results = [
            scalars.free(),
            index.free(),
            bitmap.free(),
            digits.free(),
            sorted.free(),
            counts.free(),
            offsets.free(),
            tile_sums.free(),
            buckets.free(),
            window_sums.free(),
        ];
        let more = head_keys.into_iter().map(DeviceBuffer::free);
        let pts = head_pts.into_iter().chain(partials).map(DeviceBuffer::free);
        results.into_iter().chain(more).chain(pts).collect()
    }
    /// Windows per pass for an MSM of n scalars under `plan` (≥ 1 when n ≤ max_len).
    fn windows_per_pass(&self, n: usize, plan: WindowPlan) -> Result<u32, CudaError> {
        let by_space = (self.sizes.entries / n).min(self.sizes.keys / plan.buckets());
        let wg = by_space
            .min(u32::MAX as usize / n)
            .min(plan.windows as usize) as u32;
        if wg == 0 || n > self.sizes.max_n {
            return Err(CudaError::InvalidInput(format!(
                "MSM of {n} scalars exceeds the workspace ({})",
                self.sizes.max_n
            )));
        }
        Ok(wg)
    }
}

// ---------------------------------------------------------------------------------
// Launch plumbing

/// Launches `kernel` of [`MODULE`] with the given locals as arguments (they must be
/// named locals so that the pointers the builder keeps outlive the launch).
macro_rules! launch {
    ($gpu:expr, $stream:expr, $kernel:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let f = $gpu.function(MODULE, $kernel)?;
        let mut args = $stream.launch_builder(&f);
        $( args.arg(&$arg); )*
        // SAFETY: every call site passes exactly the kernel's parameters (shown in a
        // comment there) as u32 values or device addresses of live buffers that the
        // caller keeps allocated until the stream has run the kernel.
        unsafe { $gpu.launch($kernel, &mut args, $cfg) }
    }};
}

fn cfg_2d(n: usize, y: u32, block: u32) -> Result<LaunchConfig, CudaError> {
    let mut cfg = grid_1d(n, block)?;
    cfg.grid_dim.1 = y.max(1);
    Ok(cfg)
}

fn u32_of(v: usize, what: &str) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::InvalidInput(format!("{what} = {v} exceeds u32")))
}

const XYZZ: u64 = std::mem::size_of::<DevG1Xyzz>() as u64;

/// # Safety
/// `dst` must hold `src.len()` values of `T`.
unsafe fn upload<T>(
    gpu: &Gpu,
    stream: &CudaStream,
    dst: CUdeviceptr,
    src: &[T],
) -> Result<(), CudaError> {
    if src.is_empty() {
        return Ok(());
    }
    gpu.context().bind_to_thread()?;
    // SAFETY: per the contract; pageable sources are staged before the call returns.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }?;
    Ok(())
}

/// Downloads `dst.len()` values from `src`, then waits for the stream (checked).
///
/// # Safety
/// `src` must hold `dst.len()` values of `T`, every bit pattern of which is valid.
unsafe fn download<T>(
    gpu: &Gpu,
    stream: &CudaStream,
    src: CUdeviceptr,
    dst: &mut [T],
) -> Result<(), CudaError> {
    gpu.context().bind_to_thread()?;
    if !dst.is_empty() {
        // SAFETY: per the contract.
        unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }?;
    }
    gpu.sync(stream, "msm download")
}

/// # Safety
/// `dst` must address `bytes` bytes of live device memory.
unsafe fn fill(
    gpu: &Gpu,
    stream: &CudaStream,
    dst: CUdeviceptr,
    byte: u8,
    bytes: usize,
) -> Result<(), CudaError> {
    gpu.context().bind_to_thread()?;
    // SAFETY: per the contract.
    unsafe { result::memset_d8_async(dst, byte, bytes, stream.cu_stream()) }?;
    Ok(())
}

/// Stage markers of one instrumented run (bench only): (stage that just ended, event).
type Clock = Vec<(&'static str, CudaEvent)>;

fn mark(
    gpu: &Gpu,
    stream: &CudaStream,
    clock: &mut Option<&mut Clock>,
    stage: &'static str,
) -> Result<(), CudaError> {
    if let Some(c) = clock.as_deref_mut() {
        let e = gpu
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(stream)?;
        c.push((stage, e));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Stage enqueuers (raw addresses; the workspace's buffers unless stated)

/// (a) out[i] = canonical(in[i]). `out` may equal `input`.
unsafe fn enqueue_from_montgomery(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: CUdeviceptr,
    input: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let n32 = u32_of(n, "n")?;
    // msm_from_montgomery(fr_t* out, const fr_t* in, u32 n)
    launch!(gpu, stream, kernel::FROM_MONTGOMERY, grid_1d(n, LIGHT_BLOCK)?; out, input, n32)
}

/// (a) digits of windows [w_begin, w_begin + wc) of n canonical scalars.
unsafe fn enqueue_digits(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: CUdeviceptr,
    scalars: CUdeviceptr,
    n: usize,
    c: u32,
    w_begin: u32,
    wc: u32,
) -> Result<(), CudaError> {
    let n32 = u32_of(n, "n")?;
    // msm_digits(u32* out, const u32* scalars, u32 n, u32 c, u32 w_begin, u32 w_count)
    launch!(gpu, stream, kernel::DIGITS, grid_1d(n, LIGHT_BLOCK)?; out, scalars, n32, c, w_begin, wc)
}

/// (b) Counting sort of the digits of `wc` windows: offsets[0..=keys], sorted entries.
/// `counts` (keys) ends as the cursor; `base_index` 0 is the identity.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_sort(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    sorted: CUdeviceptr,
    offsets: CUdeviceptr,
    counts: CUdeviceptr,
    tile_sums: CUdeviceptr,
    digits: CUdeviceptr,
    base_index: CUdeviceptr,
    n: usize,
    c: u32,
    wc: u32,
) -> Result<(), CudaError> {
    let keys = wc as usize * (1usize << (c - 1));
    let (n32, k32) = (u32_of(n, "n")?, u32_of(keys, "keys")?);
    let tiles = keys.div_ceil(SCAN_TILE);
    let t32 = u32_of(tiles, "tiles")?;
    // SAFETY: `counts` holds `keys` u32.
    unsafe { fill(gpu, stream, counts, 0, keys * 4) }?;
    // msm_bucket_count(u32* counts, const u32* digits, u32 n, u32 c); grid.y = window
    launch!(gpu, stream, kernel::BUCKET_COUNT, cfg_2d(n, wc, LIGHT_BLOCK)?; counts, digits, n32, c)?;
    // msm_scan_reduce(u32* tile_sums, const u32* counts, u32 K)
    launch!(gpu, stream, kernel::SCAN_REDUCE, grid_1d(tiles * SCAN_THREADS as usize, SCAN_THREADS)?; tile_sums, counts, k32)?;
    // msm_scan_tiles(u32* tile_sums, u32 tiles)
    launch!(gpu, stream, kernel::SCAN_TILES, grid_1d(1, SCAN_THREADS)?; tile_sums, t32)?;
    // msm_scan_apply(u32* offsets, u32* cursor, const u32* counts, const u32* tile_sums, u32 K)
    launch!(gpu, stream, kernel::SCAN_APPLY, grid_1d(tiles * SCAN_THREADS as usize, SCAN_THREADS)?; offsets, counts, counts, tile_sums, k32)?;
    // msm_bucket_scatter(u32* sorted, u32* cursor, const u32* digits, const u32* base_index, u32 n, u32 c)
    launch!(gpu, stream, kernel::BUCKET_SCATTER, cfg_2d(n, wc, LIGHT_BLOCK)?; sorted, counts, digits, base_index, n32, c)
}

/// (c) Bucket sums over `slices` slices of the sorted entries, then the heads folded
/// level by level. The head buffers must hold `slices` entries each.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_accumulate(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    buckets: CUdeviceptr,
    head_keys: [CUdeviceptr; 2],
    head_pts: [CUdeviceptr; 2],
    sorted: CUdeviceptr,
    offsets: CUdeviceptr,
    bases: CUdeviceptr,
    keys: usize,
    slices: usize,
    fold: u32,
) -> Result<(), CudaError> {
    let (k32, s32) = (u32_of(keys, "keys")?, u32_of(slices, "slices")?);
    let (hk0, hp0) = (head_keys[0], head_pts[0]);
    // msm_accumulate_sorted(xyzz* buckets, u32* head_keys, xyzz* head_pts, const u32* sorted,
    //                       const u32* offsets, const affine* bases, u32 K, u32 S)
    launch!(gpu, stream, kernel::ACCUMULATE_SORTED, grid_1d(slices, POINT_BLOCK)?; buckets, hk0, hp0, sorted, offsets, bases, k32, s32)?;
    let (mut count, mut i) = (slices, 0);
    while count > 1 {
        let out_count = count.div_ceil(fold as usize);
        let (ok, op, ik, ip) = (head_keys[1 - i], head_pts[1 - i], head_keys[i], head_pts[i]);
        let c32 = u32_of(count, "heads")?;
        // msm_accumulate_heads(xyzz* buckets, u32* out_keys, xyzz* out_pts, const u32* in_keys,
        //                      const xyzz* in_pts, u32 count, u32 T)
        launch!(gpu, stream, kernel::ACCUMULATE_HEADS, grid_1d(out_count, POINT_BLOCK)?; buckets, ok, op, ik, ip, c32, fold)?;
        (count, i) = (out_count, 1 - i);
    }
    Ok(())
}

/// Buckets per reduction thread: enough groups to fill `slices` threads, at most NB.
fn reduction_span(plan: WindowPlan, wc: u32, slices: usize) -> u32 {
    let want = (wc as usize * plan.buckets()).div_ceil(slices.max(1));
    want.next_power_of_two().min(plan.buckets()) as u32
}

/// (d) Window sums of `wc` windows into out[0..wc]: per-group running sums into
/// `partials[0]`, then folded `FOLD` at a time, ping-ponging between the two partials.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_reduce(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: CUdeviceptr,
    partials: [CUdeviceptr; 2],
    buckets: CUdeviceptr,
    offsets: CUdeviceptr,
    c: u32,
    wc: u32,
    span: u32,
) -> Result<(), CudaError> {
    let groups = (1usize << (c - 1)) / span as usize;
    let p0 = partials[0];
    // msm_reduce_buckets(xyzz* out, const xyzz* buckets, const u32* offsets, u32 c, u32 w_count, u32 L)
    launch!(gpu, stream, kernel::REDUCE_BUCKETS, grid_1d(wc as usize * groups, POINT_BLOCK)?; p0, buckets, offsets, c, wc, span)?;
    // SAFETY: forwarded.
    unsafe { enqueue_fold(gpu, stream, out, partials, groups, wc) }
}

/// out[g] = Σ partials[0][g·len .. (g+1)·len) for each of `groups` groups.
unsafe fn enqueue_fold(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: CUdeviceptr,
    partials: [CUdeviceptr; 2],
    mut len: usize,
    groups: u32,
) -> Result<(), CudaError> {
    let mut i = 0;
    loop {
        let out_len = len.div_ceil(FOLD as usize);
        let (src, dst) = (
            partials[i],
            if out_len == 1 { out } else { partials[1 - i] },
        );
        let l32 = u32_of(len, "fold length")?;
        // msm_sum_chunks(xyzz* out, const xyzz* in, u32 len, u32 chunk); grid.y = group
        launch!(gpu, stream, kernel::SUM_CHUNKS, cfg_2d(out_len, groups, POINT_BLOCK)?; dst, src, l32, FOLD)?;
        if out_len == 1 {
            return Ok(());
        }
        (len, i) = (out_len, 1 - i);
    }
}

/// (e) *out = Σ_w 2^(cw)·sums[w] (+ *out when `accumulate`).
unsafe fn enqueue_combine(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: CUdeviceptr,
    sums: CUdeviceptr,
    windows: u32,
    c: u32,
    accumulate: bool,
) -> Result<(), CudaError> {
    let acc = u32::from(accumulate);
    // msm_combine_windows(xyzz* out, const xyzz* window_sums, u32 count, u32 c, u32 accumulate)
    launch!(gpu, stream, kernel::COMBINE_WINDOWS, grid_1d(1, 32)?; out, sums, windows, c, acc)
}

/// Pippenger over the n canonical scalars already in `ws.scalars`; writes (or adds to)
/// the point at `out`. `base_index` 0: scalar i goes with base i.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_pippenger(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    bases: CUdeviceptr,
    n: usize,
    base_index: CUdeviceptr,
    out: CUdeviceptr,
    accumulate: bool,
    mut clock: Option<&mut Clock>,
) -> Result<(), CudaError> {
    if n == 0 {
        // SAFETY: `out` is one point.
        return if accumulate {
            Ok(())
        } else {
            unsafe { fill(gpu, stream, out, 0, XYZZ as usize) }
        };
    }
    let plan = WindowPlan::for_len(n);
    let wg = ws.windows_per_pass(n, plan)?;
    let w = &*ws;
    let (hk, hp) = (
        [w.head_keys[0].raw(), w.head_keys[1].raw()],
        [w.head_pts[0].raw(), w.head_pts[1].raw()],
    );
    let partials = [w.partials[0].raw(), w.partials[1].raw()];
    for w_begin in (0..plan.windows).step_by(wg as usize) {
        let wc = wg.min(plan.windows - w_begin);
        let keys = wc as usize * plan.buckets();
        // SAFETY (all stages): the workspace's buffers are sized by `windows_per_pass`
        // for wc windows of n scalars; bases and base_index per the caller.
        unsafe {
            enqueue_digits(
                gpu,
                stream,
                w.digits.raw(),
                w.scalars.raw(),
                n,
                plan.c,
                w_begin,
                wc,
            )?;
            mark(gpu, stream, &mut clock, "digits")?;
            enqueue_sort(
                gpu,
                stream,
                w.sorted.raw(),
                w.offsets.raw(),
                w.counts.raw(),
                w.tile_sums.raw(),
                w.digits.raw(),
                base_index,
                n,
                plan.c,
                wc,
            )?;
            mark(gpu, stream, &mut clock, "sort")?;
            let slices = (wc as usize * n).div_ceil(4).clamp(1, w.sizes.slices);
            enqueue_accumulate(
                gpu,
                stream,
                w.buckets.raw(),
                hk,
                hp,
                w.sorted.raw(),
                w.offsets.raw(),
                bases,
                keys,
                slices,
                FOLD,
            )?;
            mark(gpu, stream, &mut clock, "accumulate")?;
            let span = reduction_span(plan, wc, w.sizes.slices);
            let sums = w.window_sums.raw() + u64::from(w_begin) * XYZZ;
            enqueue_reduce(
                gpu,
                stream,
                sums,
                partials,
                w.buckets.raw(),
                w.offsets.raw(),
                plan.c,
                wc,
                span,
            )?;
            mark(gpu, stream, &mut clock, "reduce")?;
        }
    }
    // SAFETY: window_sums holds plan.windows ≤ 64 points; `out` one.
    unsafe {
        enqueue_combine(
            gpu,
            stream,
            out,
            w.window_sums.raw(),
            plan.windows,
            plan.c,
            accumulate,
        )
    }?;
    mark(gpu, stream, &mut clock, "combine")
}

/// Batch addition of the bases whose bit is set in the bitmap at `bitmap` (n bits).
unsafe fn enqueue_batch_add(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &MsmWorkspace,
    bases: CUdeviceptr,
    bitmap: CUdeviceptr,
    n: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    if n == 0 {
        // SAFETY: `out` is one point.
        return unsafe { fill(gpu, stream, out, 0, XYZZ as usize) };
    }
    let words = n.div_ceil(32);
    let per = words.div_ceil(ws.sizes.slices).max(1);
    let parts = words.div_ceil(per);
    let (p0, n32, per32) = (ws.partials[0].raw(), u32_of(n, "n")?, u32_of(per, "words")?);
    // msm_batch_add_bitmap(xyzz* out, const affine* bases, const u32* bitmap, u32 n, u32 words)
    launch!(gpu, stream, kernel::BATCH_ADD_BITMAP, grid_1d(parts, POINT_BLOCK)?; p0, bases, bitmap, n32, per32)?;
    // SAFETY: parts ≤ slices ≤ partials[0]; the first fold ≤ partials[1].
    unsafe {
        enqueue_fold(
            gpu,
            stream,
            out,
            [ws.partials[0].raw(), ws.partials[1].raw()],
            parts,
            1,
        )
    }
}

/// A point slot for the `*_enqueue` functions to write.
fn slot(out: &mut DeviceBuffer<DevG1Xyzz>, index: usize) -> Result<CUdeviceptr, CudaError> {
    if index >= out.len() {
        return Err(CudaError::InvalidInput(format!(
            "result slot {index} of {}",
            out.len()
        )));
    }
    Ok(out.raw() + index as u64 * XYZZ)
}

/// Copies the scalars into the workspace (host) or reads them in place (device), and
/// converts them to canonical integers in `ws.scalars`.
fn stage_scalars(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    scalars: ScalarsRef<'_>,
) -> Result<(), CudaError> {
    let n = scalars.len();
    if n > ws.sizes.max_n {
        return Err(CudaError::InvalidInput(format!(
            "MSM of {n} scalars exceeds the workspace ({})",
            ws.sizes.max_n
        )));
    }
    let dst = ws.scalars.raw();
    let src = match scalars {
        ScalarsRef::Host(s) => {
            // SAFETY: `ws.scalars` holds max_n ≥ n scalars.
            unsafe { upload(gpu, stream, dst, fr_as_dev(s)) }?;
            dst
        }
        ScalarsRef::Pinned(p) => {
            stream.memcpy_htod(p, &mut ws.scalars)?;
            dst
        }
        ScalarsRef::Device(d) => d.ptr,
    };
    if n == 0 {
        return Ok(());
    }
    // SAFETY: both hold n scalars (the device source per `DeviceScalars`' contract).
    unsafe { enqueue_from_montgomery(gpu, stream, dst, src, n) }
}

// ---------------------------------------------------------------------------------
// Public entry points

/// Enqueues Σ scalars_i·bases_i into `out[index]`. Extra bases are ignored (as in
/// arkworks' `msm_bigint`); fewer bases than scalars is an error.
#[allow(clippy::too_many_arguments)]
pub fn msm_enqueue(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    scalars: ScalarsRef<'_>,
    out: &mut DeviceBuffer<DevG1Xyzz>,
    index: usize,
) -> Result<(), CudaError> {
    let n = scalars.len();
    if n > bases.len {
        return Err(CudaError::InvalidInput(format!(
            "{n} scalars but {} bases",
            bases.len
        )));
    }
    let out = slot(out, index)?;
    stage_scalars(gpu, stream, ws, scalars)?;
    // SAFETY: bases hold ≥ n points; `out` is a slot of a live buffer.
    unsafe { enqueue_pippenger(gpu, stream, ws, bases.ptr, n, 0, out, false, None) }
}

/// Enqueues Σ bases_i over the set bits i < len of `ones` into `out[index]`.
#[allow(clippy::too_many_arguments)]
pub fn batch_add_enqueue(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    ones: &[u32],
    len: usize,
    out: &mut DeviceBuffer<DevG1Xyzz>,
    index: usize,
) -> Result<(), CudaError> {
    if len > bases.len || len > ws.sizes.max_n || ones.len() < len.div_ceil(32) {
        return Err(CudaError::InvalidInput(format!(
            "batch add of {len} bits: {} bases, workspace {}, bitmap {} words",
            bases.len,
            ws.sizes.max_n,
            ones.len()
        )));
    }
    let out = slot(out, index)?;
    let words = &ones[..len.div_ceil(32)];
    // SAFETY: the bitmap buffer holds ⌈max_n/32⌉ words; bases ≥ len points.
    unsafe {
        upload(gpu, stream, ws.bitmap.raw(), words)?;
        enqueue_batch_add(gpu, stream, ws, bases.ptr, ws.bitmap.raw(), len, out)
    }
}

/// Enqueues the split MSM: batch addition over the ones, plus Pippenger over the
/// others with their bases read by index, into `out[index]`.
pub fn msm_split_enqueue(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    split: &SplitScalars,
    out: &mut DeviceBuffer<DevG1Xyzz>,
    index: usize,
) -> Result<(), CudaError> {
    batch_add_enqueue(gpu, stream, ws, bases, &split.ones, split.len, out, index)?;
    let out = slot(out, index)?;
    let m = split.other_indices.len();
    stage_scalars(gpu, stream, ws, ScalarsRef::Host(&split.other_scalars))?;
    // SAFETY: the index buffer holds max_n ≥ m entries, each < split.len ≤ bases.len.
    unsafe {
        upload(gpu, stream, ws.index.raw(), &split.other_indices)?;
        enqueue_pippenger(
            gpu,
            stream,
            ws,
            bases.ptr,
            m,
            ws.index.raw(),
            out,
            true,
            None,
        )
    }
}

/// Waits for `stream` (checked) and converts every slot of `out`. A slot that holds no
/// point of G1 (unreduced coordinates, or off the curve) is an error.
pub fn read_points(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    out: &DeviceBuffer<DevG1Xyzz>,
) -> Result<Vec<G1Projective>, CudaError> {
    let mut host = vec![DevG1Xyzz::default(); out.len()];
    // SAFETY: `out` holds out.len() points; any bits are a valid DevG1Xyzz.
    unsafe { download(gpu, stream, out.raw(), &mut host) }?;
    host.iter()
        .enumerate()
        .map(|(i, d)| to_point(d, i))
        .collect()
}

fn to_point(d: &DevG1Xyzz, i: usize) -> Result<G1Projective, CudaError> {
    xyzz_to_projective(d)
        .filter(|p| p.into_affine().is_on_curve())
        .ok_or_else(|| {
            CudaError::InvalidInput(format!("device MSM result {i} is not a point of G1: {d:?}"))
        })
}

/// Runs `enqueue` with a workspace for `len` scalars and a one-point output, waits,
/// frees both (and waits for the frees), and returns the point.
fn run_once(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    len: usize,
    enqueue: impl FnOnce(&mut MsmWorkspace, &mut DeviceBuffer<DevG1Xyzz>) -> Result<(), CudaError>,
) -> Result<G1Projective, CudaError> {
    let mut ws = MsmWorkspace::new(gpu, stream, len, AllocKind::StreamOrdered)?;
    let mut out = gpu.alloc_async::<DevG1Xyzz>(stream, 1)?;
    gpu.poison(stream, &mut out)?;
    let run = enqueue(&mut ws, &mut out).and_then(|()| read_points(gpu, stream, &out));
    let freed = ws
        .free()
        .and(out.free())
        .and_then(|()| gpu.sync(stream, "msm scratch free"));
    let point = run?
        .pop()
        .ok_or_else(|| CudaError::InvalidInput("no MSM result".into()))?;
    freed.map(|()| point)
}

/// Σ scalars_i·bases_i (scratch allocated and freed inside).
pub fn msm(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    bases: BasesView<'_>,
    scalars: ScalarsRef<'_>,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, scalars.len(), |ws, out| {
        msm_enqueue(gpu, stream, ws, bases, scalars, out, 0)
    })
}

/// Σ bases_i over the set bits i < len of `ones` (bit i % 32 of word i / 32).
pub fn batch_add(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    bases: BasesView<'_>,
    ones: &[u32],
    len: usize,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, len, |ws, out| {
        batch_add_enqueue(gpu, stream, ws, bases, ones, len, out, 0)
    })
}

/// The split MSM of `split`'s scalars (scratch allocated and freed inside).
pub fn msm_split(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    bases: BasesView<'_>,
    split: &SplitScalars,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, split.len, |ws, out| {
        msm_split_enqueue(gpu, stream, ws, bases, split, out, 0)
    })
}

// ---------------------------------------------------------------------------------
// Test data and the benchmark

/// n distinct-looking bases fast: P_(i+1) = P_i + D from random P_0, D, walked in
/// parallel chunks (one scalar multiplication per chunk) and batch-normalized.
pub fn walk_bases(n: usize, seed: u64) -> Vec<G1Affine> {
    const CHUNK: usize = 1 << 14;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let (p0, d) = (G1Projective::rand(&mut rng), G1Projective::rand(&mut rng));
    let step = d * Fr::from(CHUNK as u64);
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .flat_map_iter(|j| {
            let mut p = p0 + step * Fr::from(j as u64);
            let v: Vec<G1Projective> = (0..CHUNK.min(n - j * CHUNK))
                .map(|_| {
                    let q = p;
                    p += d;
                    q
                })
                .collect();
            G1Projective::normalize_batch(&v)
        })
        .collect()
}

/// n uniform scalars, generated in parallel chunks from `seed`.
pub fn random_scalars(n: usize, seed: u64) -> Vec<Fr> {
    const CHUNK: usize = 1 << 16;
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .flat_map_iter(|j| {
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(
                seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            (0..CHUNK.min(n - j * CHUNK)).map(move |_| Fr::rand(&mut rng))
        })
        .collect()
}

/// Device timing of one MSM size (resident bases, pinned host scalars, the copy of the
/// scalars included).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MsmTiming {
    pub log_n: u32,
    pub plan: WindowPlan,
    /// Timed runs after the warm-up.
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Device time per stage of one more run (scalars = copy + conversion), in ms,
    /// summed over the window passes.
    pub stages_ms: Vec<(String, f64)>,
    /// Every run returned the same point (a point that moves between runs is a race).
    pub consistent: bool,
    pub workspace_bytes: u64,
}

/// Times [`msm_enqueue`] at each size: one warm-up and `runs` (at least 3) timed runs
/// between CUDA events, median reported. Bases (a random walk) are uploaded once for
/// the largest size; the workspace is allocated once, outside the timing.
pub fn bench_msm(gpu: &Gpu, log_sizes: &[u32], runs: usize) -> Result<Vec<MsmTiming>, CudaError> {
    let runs = runs.max(3);
    let Some(&max_log) = log_sizes.iter().max() else {
        return Ok(Vec::new());
    };
    if max_log > 28 {
        return Err(CudaError::InvalidInput(format!(
            "bench size 2^{max_log} unsupported (max 2^28)"
        )));
    }
    let stream = gpu.new_stream()?;
    let bases = DeviceBases::upload(
        gpu,
        &stream,
        &walk_bases(1 << max_log, 1),
        AllocKind::StreamOrdered,
    )?;
    let mut ws = MsmWorkspace::new(gpu, &stream, 1 << max_log, AllocKind::StreamOrdered)?;
    let mut out = gpu.alloc_async::<DevG1Xyzz>(&stream, 1)?;
    let mut timings = Vec::with_capacity(log_sizes.len());
    for &log_n in log_sizes {
        let n = 1usize << log_n;
        let scalars = random_scalars(n, u64::from(log_n));
        // SAFETY: every element is written below before any read.
        let mut pinned = unsafe { gpu.context().alloc_pinned::<DevFr>(n) }?;
        pinned.as_mut_slice()?.copy_from_slice(fr_as_dev(&scalars));
        let (mut times, mut first, mut consistent) = (Vec::with_capacity(runs), None, true);
        for run in 0..=runs {
            let ms = time_on_stream(gpu, &stream, || {
                msm_enqueue(
                    gpu,
                    &stream,
                    &mut ws,
                    bases.view(),
                    ScalarsRef::Pinned(&pinned),
                    &mut out,
                    0,
                )
            })?;
            let p = read_points(gpu, &stream, &out)?[0];
            consistent &= *first.get_or_insert(p) == p;
            if run > 0 {
                times.push(ms);
            }
        }
        let stages_ms = staged_run(gpu, &stream, &mut ws, &bases, &pinned, &mut out)?;
        consistent &= read_points(gpu, &stream, &out)?[0] == first.unwrap_or_default();
        let (min_ms, max_ms) = times
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &t| (a.min(t), b.max(t)));
        timings.push(MsmTiming {
            log_n,
            plan: WindowPlan::for_len(n),
            runs,
            median_ms: median(&mut times),
            min_ms,
            max_ms,
            stages_ms,
            consistent,
            workspace_bytes: ws.bytes(),
        });
    }
    ws.free()?;
    out.free()?;
    bases.free()?;
    gpu.sync(&stream, "msm bench free")?;
    Ok(timings)
}

/// One MSM with an event after each stage; device ms per stage name, in order.
fn staged_run(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ws: &mut MsmWorkspace,
    bases: &DeviceBases,
    scalars: &PinnedHostSlice<DevFr>,
    out: &mut DeviceBuffer<DevG1Xyzz>,
) -> Result<Vec<(String, f64)>, CudaError> {
    let mut clock: Clock = Vec::new();
    mark(gpu, stream, &mut Some(&mut clock), "start")?;
    stage_scalars(gpu, stream, ws, ScalarsRef::Pinned(scalars))?;
    mark(gpu, stream, &mut Some(&mut clock), "scalars")?;
    let o = slot(out, 0)?;
    // SAFETY: bases hold ≥ n points (n ≤ 2^max_log); `o` is a live slot.
    unsafe {
        enqueue_pippenger(
            gpu,
            stream,
            ws,
            bases.view().ptr,
            scalars.len(),
            0,
            o,
            false,
            Some(&mut clock),
        )
    }?;
    gpu.sync(stream, "msm staged run")?;
    let mut stages: Vec<(String, f64)> = Vec::new();
    for pair in clock.windows(2) {
        let ms = f64::from(pair[0].1.elapsed_ms(&pair[1].1)?);
        match stages.iter_mut().find(|(name, _)| name == pair[1].0) {
            Some((_, t)) => *t += ms,
            None => stages.push((pair[1].0.to_owned(), ms)),
        }
    }
    Ok(stages)
}

// ---------------------------------------------------------------------------------
// Stages alone

/// Each pipeline stage alone, host data in and out, through the same enqueuers as the
/// pipeline (the per-stage tests). Outputs are poisoned (0xA5) before each launch, so an
/// element a kernel fails to write is caught.
pub mod stages {
    use super::*;

    fn buffer<T>(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        host: &[T],
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let buf = gpu.alloc_async::<T>(stream, host.len())?;
        // SAFETY: `buf` holds host.len() values.
        unsafe { upload(gpu, stream, buf.raw(), host) }?;
        Ok(buf)
    }
    fn poisoned<T>(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let mut buf = gpu.alloc_async::<T>(stream, len)?;
        gpu.poison(stream, &mut buf)?;
        Ok(buf)
    }
    fn points(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        buf: &DeviceBuffer<DevG1Xyzz>,
    ) -> Result<Vec<DevG1Xyzz>, CudaError> {
        let mut host = vec![DevG1Xyzz::default(); buf.len()];
        // SAFETY: `buf` holds host.len() points.
        unsafe { download(gpu, stream, buf.raw(), &mut host) }?;
        Ok(host)
    }
    /// A point slot nothing valid can equal, for data a kernel must not read.
    fn poison_point() -> DevG1Xyzz {
        let f = super::super::layout::DevFq([0xa5a5_a5a5_a5a5_a5a5; 6]);
        DevG1Xyzz {
            x: f,
            y: f,
            zz: f,
            zzz: f,
        }
    }

    /// (a) Canonical limbs of each scalar.
    pub fn from_montgomery(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        scalars: &[Fr],
    ) -> Result<Vec<[u64; 4]>, CudaError> {
        let input = buffer(gpu, stream, fr_as_dev(scalars))?;
        let out = poisoned::<DevFr>(gpu, stream, scalars.len())?;
        if !scalars.is_empty() {
            // SAFETY: both hold scalars.len() values.
            unsafe { enqueue_from_montgomery(gpu, stream, out.raw(), input.raw(), scalars.len()) }?;
        }
        let mut host = vec![DevFr::default(); scalars.len()];
        // SAFETY: `out` holds host.len() scalars.
        unsafe { download(gpu, stream, out.raw(), &mut host) }?;
        Ok(host.into_iter().map(|d| d.0).collect())
    }

    /// (a) Encoded digits of windows [w_begin, w_begin + w_count), window-major.
    pub fn digits(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        canonical: &[[u64; 4]],
        plan: WindowPlan,
        w_begin: u32,
        w_count: u32,
    ) -> Result<Vec<u32>, CudaError> {
        let n = canonical.len();
        let input = buffer(gpu, stream, canonical)?;
        let out = poisoned::<u32>(gpu, stream, n * w_count as usize)?;
        if n > 0 {
            // SAFETY: `out` holds w_count·n digits, `input` n scalars.
            unsafe {
                enqueue_digits(
                    gpu,
                    stream,
                    out.raw(),
                    input.raw(),
                    n,
                    plan.c,
                    w_begin,
                    w_count,
                )
            }?;
        }
        let mut host = vec![0u32; out.len()];
        // SAFETY: as above.
        unsafe { download(gpu, stream, out.raw(), &mut host) }?;
        Ok(host)
    }

    /// (b) output: offsets[0..=K] and the sorted entries (offsets[K] of them).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Sorted {
        pub offsets: Vec<u32>,
        pub entries: Vec<u32>,
    }

    /// (b) Counting sort of `w_count` windows of n digits (`digits` window-major).
    pub fn bucket_sort(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        digits: &[u32],
        n: usize,
        c: u32,
        w_count: u32,
        base_index: Option<&[u32]>,
    ) -> Result<Sorted, CudaError> {
        let keys = w_count as usize * (1usize << (c - 1));
        if digits.len() != n * w_count as usize || base_index.is_some_and(|b| b.len() != n) {
            return Err(CudaError::InvalidInput(
                "bucket_sort: digits or index length".into(),
            ));
        }
        let d = buffer(gpu, stream, digits)?;
        let index = base_index.map(|b| buffer(gpu, stream, b)).transpose()?;
        let (sorted, offsets) = (
            poisoned::<u32>(gpu, stream, digits.len())?,
            poisoned::<u32>(gpu, stream, keys + 1)?,
        );
        let (counts, tiles) = (
            poisoned::<u32>(gpu, stream, keys)?,
            poisoned::<u32>(gpu, stream, keys.div_ceil(SCAN_TILE))?,
        );
        let idx = index.as_ref().map_or(0, |b| b.raw());
        // SAFETY: sizes as enqueue_sort requires.
        unsafe {
            enqueue_sort(
                gpu,
                stream,
                sorted.raw(),
                offsets.raw(),
                counts.raw(),
                tiles.raw(),
                d.raw(),
                idx,
                n,
                c,
                w_count,
            )
        }?;
        let mut off = vec![0u32; keys + 1];
        // SAFETY: `offsets` holds keys + 1 values.
        unsafe { download(gpu, stream, offsets.raw(), &mut off) }?;
        let total = (off[keys] as usize).min(digits.len());
        let mut entries = vec![0u32; total];
        // SAFETY: `sorted` holds digits.len() ≥ total entries.
        unsafe { download(gpu, stream, sorted.raw(), &mut entries) }?;
        Ok(Sorted {
            offsets: off,
            entries,
        })
    }

    /// (c) Bucket sums (infinity for an empty bucket) with `slices` accumulation
    /// threads and `fold` heads per thread and level (small values force deep folding).
    pub fn accumulate(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        bases: BasesView<'_>,
        sorted: &Sorted,
        slices: usize,
        fold: u32,
    ) -> Result<Vec<G1Projective>, CudaError> {
        let keys = sorted.offsets.len().saturating_sub(1);
        if keys == 0
            || slices == 0
            || fold < 2
            || sorted
                .entries
                .iter()
                .any(|e| (e & 0x7fff_ffff) as usize >= bases.len)
        {
            return Err(CudaError::InvalidInput(
                "accumulate: bad keys, slices, fold or index".into(),
            ));
        }
        let (off, ent) = (
            buffer(gpu, stream, &sorted.offsets)?,
            buffer(gpu, stream, &sorted.entries)?,
        );
        let buckets = poisoned::<DevG1Xyzz>(gpu, stream, keys)?;
        let hk = [
            poisoned::<u32>(gpu, stream, slices)?,
            poisoned::<u32>(gpu, stream, slices)?,
        ];
        let hp = [
            poisoned::<DevG1Xyzz>(gpu, stream, slices)?,
            poisoned::<DevG1Xyzz>(gpu, stream, slices)?,
        ];
        // SAFETY: sizes as enqueue_accumulate requires; entries index the bases.
        unsafe {
            enqueue_accumulate(
                gpu,
                stream,
                buckets.raw(),
                [hk[0].raw(), hk[1].raw()],
                [hp[0].raw(), hp[1].raw()],
                ent.raw(),
                off.raw(),
                bases.ptr,
                keys,
                slices,
                fold,
            )
        }?;
        let host = points(gpu, stream, &buckets)?;
        (0..keys)
            .map(|k| {
                if sorted.offsets[k] == sorted.offsets[k + 1] {
                    Ok(G1Projective::zero())
                } else {
                    to_point(&host[k], k)
                }
            })
            .collect()
    }

    /// (d) Window sums Σ_j j·B_j of `w_count` windows of 2^(c−1) buckets, `span`
    /// buckets per thread. Zero buckets are marked empty and their slots poisoned.
    pub fn reduce(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        buckets: &[G1Projective],
        c: u32,
        w_count: u32,
        span: u32,
    ) -> Result<Vec<G1Projective>, CudaError> {
        let nb = 1usize << (c - 1);
        if buckets.len() != w_count as usize * nb || !span.is_power_of_two() || span as usize > nb {
            return Err(CudaError::InvalidInput(
                "reduce: bucket count or span".into(),
            ));
        }
        let mut offsets = vec![0u32];
        for b in buckets {
            offsets.push(offsets[offsets.len() - 1] + u32::from(!b.is_zero()));
        }
        let dev: Vec<DevG1Xyzz> = buckets
            .iter()
            .map(|b| {
                if b.is_zero() {
                    poison_point()
                } else {
                    super::super::layout::projective_to_xyzz(b)
                }
            })
            .collect();
        let (b, off) = (buffer(gpu, stream, &dev)?, buffer(gpu, stream, &offsets)?);
        let groups = w_count as usize * (nb / span as usize);
        let partials = [
            poisoned::<DevG1Xyzz>(gpu, stream, groups)?,
            poisoned::<DevG1Xyzz>(gpu, stream, groups.div_ceil(FOLD as usize) + 64)?,
        ];
        let out = poisoned::<DevG1Xyzz>(gpu, stream, w_count as usize)?;
        // SAFETY: sizes as enqueue_reduce requires.
        unsafe {
            enqueue_reduce(
                gpu,
                stream,
                out.raw(),
                [partials[0].raw(), partials[1].raw()],
                b.raw(),
                off.raw(),
                c,
                w_count,
                span,
            )
        }?;
        points(gpu, stream, &out)?
            .iter()
            .enumerate()
            .map(|(i, d)| to_point(d, i))
            .collect()
    }

    /// (e) Σ_w 2^(cw)·sums[w] by Horner on the device.
    pub fn combine(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        sums: &[G1Projective],
        c: u32,
    ) -> Result<G1Projective, CudaError> {
        if sums.is_empty() || sums.len() > 64 {
            return Err(CudaError::InvalidInput("combine: 1..=64 windows".into()));
        }
        let dev: Vec<DevG1Xyzz> = sums
            .iter()
            .map(super::super::layout::projective_to_xyzz)
            .collect();
        let input = buffer(gpu, stream, &dev)?;
        let out = poisoned::<DevG1Xyzz>(gpu, stream, 1)?;
        // SAFETY: `input` holds sums.len() points, `out` one.
        unsafe {
            enqueue_combine(
                gpu,
                stream,
                out.raw(),
                input.raw(),
                sums.len() as u32,
                c,
                false,
            )
        }?;
        to_point(&points(gpu, stream, &out)?[0], 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ec::AffineRepr;
    use ark_ff::{BigInteger, Field, PrimeField};

    fn reconstruct(d: &[i64], c: u32) -> Fr {
        let base = Fr::from(2u64).pow([u64::from(c)]);
        d.iter().rev().fold(Fr::zero(), |acc, &x| {
            acc * base
                + if x < 0 {
                    -Fr::from(x.unsigned_abs())
                } else {
                    Fr::from(x as u64)
                }
        })
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
        }
        assert_eq!(WindowPlan::for_len(1 << 24).c, 20);
        assert!(WindowPlan::for_len(1 << 16).c < WindowPlan::for_len(1 << 22).c);
    }

    #[test]
    fn msm_signed_digits_reconstruct() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let mut ks: Vec<Fr> = (0..200).map(|_| Fr::rand(&mut rng)).collect();
        ks.extend([Fr::zero(), Fr::one(), -Fr::one(), Fr::from(2u64).pow([254])]);
        for c in MIN_WINDOW_BITS..=MAX_WINDOW_BITS {
            let plan = WindowPlan::with_bits(c);
            for k in &ks {
                let d = signed_digits(&k.into_bigint().0, plan);
                let half = 1i64 << (c - 1);
                assert!(d.iter().all(|&x| -half < x && x <= half), "c={c}");
                assert_eq!(reconstruct(&d, c), *k, "c={c}");
            }
        }
    }

    #[test]
    fn msm_digits_at_the_boundary_carry() {
        // Every window equal to 2^(c-1) stays positive (no carry); 2^(c-1) + 1 in every
        // window turns negative and carries all the way up.
        for c in [4u32, 13, 16, 20] {
            let plan = WindowPlan::with_bits(c);
            for v in [1u64 << (c - 1), (1u64 << (c - 1)) + 1, (1u64 << c) - 1] {
                let mut k = ark_ff::BigInt::<4>::zero();
                for w in 0..plan.windows {
                    let bits = w * c;
                    if bits + c <= 254 {
                        let mut t = ark_ff::BigInt::<4>::from(v);
                        t <<= bits;
                        k.add_with_carry(&t);
                    }
                }
                assert!(k < Fr::MODULUS);
                let d = signed_digits(&k.0, plan);
                assert_eq!(
                    reconstruct(&d, c),
                    Fr::from_bigint(k).unwrap(),
                    "c={c} v={v}"
                );
                assert!(d.iter().all(|&x| x.unsigned_abs() <= 1 << (c - 1)));
            }
        }
    }

    #[test]
    fn msm_encode_digit() {
        assert_eq!(encode_digit(0), 0);
        assert_eq!(encode_digit(5), 5);
        assert_eq!(encode_digit(-5), 5 | 1 << 31);
    }

    #[test]
    fn msm_classify_matches_scalar_classes() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(9);
        for n in [0usize, 1, 31, 32, 33, 100, 1000] {
            let s: Vec<Fr> = (0..n)
                .map(|i| match i % 5 {
                    0 | 3 => Fr::zero(),
                    1 => Fr::one(),
                    _ => Fr::rand(&mut rng),
                })
                .collect();
            let a = classify(&s);
            let b = SplitScalars::from_classes(&ScalarClasses::classify(&s), &s).unwrap();
            assert_eq!(a, b);
            assert_eq!(
                a.zeros_count() + a.ones_count() + a.other_indices().len(),
                n
            );
            for (i, x) in s.iter().enumerate() {
                let bit = a.ones_bitmap()[i / 32] >> (i % 32) & 1 == 1;
                assert_eq!(bit, x.is_one());
            }
            assert!(a
                .other_scalars()
                .iter()
                .all(|x| !x.is_zero() && !x.is_one()));
        }
        let bad = ScalarClasses {
            len: 2,
            ones: vec![5],
            others: vec![],
        };
        assert!(SplitScalars::from_classes(&bad, &[Fr::one(); 2]).is_err());
    }

    #[test]
    fn msm_workspace_bytes_grow_with_n() {
        let a = MsmWorkspace::bytes_needed(1 << 16);
        let b = MsmWorkspace::bytes_needed(1 << 20);
        assert!(a < b);
        assert!(
            MsmWorkspace::bytes_needed_with(1 << 24, Some(2)) < MsmWorkspace::bytes_needed(1 << 24)
        );
    }

    #[test]
    fn msm_walk_bases_walks() {
        let v = walk_bases(40_000, 3);
        assert_eq!(v.len(), 40_000);
        let d = v[1].into_group() - v[0];
        assert!(v.windows(2).all(|w| w[1].into_group() - w[0] == d));
        assert!(v.iter().all(|p| p.is_on_curve()));
    }
}
