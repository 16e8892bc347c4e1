//! G1 multi-scalar multiplication on the device: Σ k_i·P_i over BLS12-381 G1.
//!
//! - [`msm`]: Pippenger with signed c-bit windows, for arbitrary scalars.
//! - [`batch_add`]: Σ P_i over a bitmap, for scalars equal to one.
//! - [`msm_split`]: the prover's split. The CPU prep classifies the scalars into zero /
//!   one / other ([`classify`] → [`SplitScalars`]); the device adds the ones' bases by
//!   batch addition and runs Pippenger on the others only. Their bases are gathered by
//!   index inside the bucket sort (a sorted entry is the base's index), so the bases are
//!   never copied.
//!
//! Bases are affine and resident ([`DeviceBases`]: uploaded once per key and device).
//! Scalars are arkworks `Fr` limbs in Montgomery form, from the host or the device
//! ([`ScalarsRef`]); the first kernel converts them to canonical integers. The API takes
//! field elements, which are always reduced (< r < 2^255): no scalar ≥ r can occur, and
//! the recoding relies on it (the top window absorbs the last carry). Device limbs that
//! are not reduced still convert to a value below r (the conversion computes a·R⁻¹ mod r).
//!
//! Each stage is one kernel of `cuda/msm.cu` (pipeline in `cuda/msm.cuh`); [`stages`]
//! runs each alone for the tests. The `*_enqueue` functions only enqueue on the caller's
//! stream and write a result record into a slot of an [`MsmResults`]: an accumulator
//! (the batch addition's sum, or zero) and the window sums. [`read_points`] waits
//! (checked), converts, and combines the windows on the host (stage (e)). The plain
//! functions ([`msm`], [`batch_add`], [`msm_split`]) allocate a workspace, wait, and
//! free it before they return. Every driver call and launch returns
//! its error; a slot that holds no point of G1 is an error too.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use ark_bls12_381::{G1Affine, G1Projective};
use ark_ec::{AdditiveGroup, CurveGroup};
use ark_ff::{Field, One, UniformRand, Zero};
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaEvent, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg};
use rand::SeedableRng;
use rayon::prelude::*;

use super::context::{download, grid_1d, invalid, launch, u32_of, upload};
use super::context::{AllocKind, CudaError, DeviceBuffer, Gpu};
use super::layout::{fr_as_dev, g1_affines_to_dev, xyzz_to_projective};
use super::layout::{DevFr, DevG1Affine, DevG1Xyzz};
use super::ntt::{median, time_on_stream};
use crate::device::ScalarClasses;
use crate::Fr;

type Stream = Arc<CudaStream>;

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
    pub const BATCH_ADD_BITMAP: &str = "msm_batch_add_bitmap";
}

/// Block sizes of msm.cu (`MSM_BLOCK_LIGHT`, `MSM_BLOCK_POINT`, `msm::SCAN_THREADS`).
const LIGHT_BLOCK: u32 = 256;
const POINT_BLOCK: u32 = 128;
const SCAN_THREADS: u32 = 256;
/// Counts per scan tile (`msm::SCAN_TILE`).
const SCAN_TILE: usize = 2048;
/// Window widths an explicit plan may use: c ≤ 20 keeps a window's 2^19 buckets at
/// 96 MiB; c ≥ 4 bounds the window count at [`MAX_WINDOWS`].
pub const MIN_WINDOW_BITS: u32 = 4;
pub const MAX_WINDOW_BITS: u32 = 20;
/// The widest window [`WindowPlan::for_len`] picks. Measured on an H200: moving from
/// c = 16 (2^21 scalars, 42.7 ms accumulating) to c = 18 (2^22, 163 ms) and c = 20
/// (2^24, 478 ms) made each bucket addition about 2× slower; with the base prefetch in
/// `accumulate_sorted` most of that is gone, but c = 16 still beat c = 18 at 2^22
/// (79.7 against 88.2 ms), so the cost model's saving in additions does not pay.
pub const MAX_PLANNED_WINDOW_BITS: u32 = 16;
pub const MAX_WINDOWS: usize = 64;
/// Most accumulation slices (threads of `accumulate_sorted`); a workspace uses as many
/// as are resident on its GPU, up to this.
const MAX_SLICES: usize = 1 << 17;
/// Heads folded per thread and level; points summed per thread in `sum_chunks`.
const FOLD: u32 = 32;
/// Scalar positions and base indices must fit 31 bits (bit 31 is the sign).
pub const MAX_LEN: usize = (1 << 31) - 1;
const XYZZ: u64 = std::mem::size_of::<DevG1Xyzz>() as u64;

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
    /// The c ≤ [`MAX_PLANNED_WINDOW_BITS`] minimising W(c)·(10·n + 14·2^c): a mixed
    /// addition (10 multiplications) per digit, two full additions (14 each) per bucket
    /// in the reduction.
    pub fn for_len(n: usize) -> WindowPlan {
        let cost = |c: u32| u128::from(256u32.div_ceil(c)) * (10 * n as u128 + (14u128 << c));
        let best = (MIN_WINDOW_BITS..=MAX_PLANNED_WINDOW_BITS).min_by_key(|&c| (cost(c), c));
        WindowPlan::with_bits(best.unwrap_or(MAX_PLANNED_WINDOW_BITS))
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

/// Affine G1 bases resident on one device (`g1_affine_t`, infinity as (0, 0)).
#[derive(Debug)]
pub struct DeviceBases {
    buf: DeviceBuffer<DevG1Affine>,
}

impl DeviceBases {
    /// Uploads `points` and waits until the copy has landed (the host side is
    /// pageable: a kernel on another stream must not race the copy).
    pub fn upload(
        gpu: &Gpu,
        stream: &Stream,
        points: &[G1Affine],
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let host = g1_affines_to_dev(points);
        let buf = gpu.alloc::<DevG1Affine>(stream, host.len(), kind)?;
        // SAFETY: `buf` holds host.len() points.
        unsafe { upload(gpu, stream, buf.raw(), &host) }?;
        gpu.sync(stream, "msm bases upload")?;
        Ok(DeviceBases { buf })
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn bytes(&self) -> u64 {
        (self.len() * std::mem::size_of::<DevG1Affine>()) as u64
    }
    pub fn view(&self) -> BasesView<'_> {
        BasesView {
            ptr: self.buf.raw(),
            len: self.len(),
            _owner: PhantomData,
        }
    }
    /// Bases `range` (e.g. a query without its first element).
    pub fn slice(&self, range: Range<usize>) -> Result<BasesView<'_>, CudaError> {
        if range.start > range.end || range.end > self.len() {
            return Err(invalid(format!("bases {range:?} out of 0..{}", self.len())));
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

/// Where the scalars are; all are arkworks Montgomery limbs (`DevFr`).
#[derive(Clone, Copy, Debug)]
pub enum ScalarsRef<'a> {
    /// Pageable host memory: the copy is staged, the slice is free when the call returns.
    Host(&'a [Fr]),
    /// Page-locked host memory, copied asynchronously in full (cudarc records the copy
    /// on the slice's event, so host access to the slice waits for it).
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
            return Err(invalid(format!(
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

/// The CPU prep's split of MSM scalars: the ones as a bitmap (bit i % 32 of word i / 32
/// is set iff scalar i is one), the others (neither 0 nor 1) as ascending indices with
/// their scalars. Zeros are in neither. Private fields keep every index below `len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitScalars {
    len: usize,
    ones: Vec<u32>,
    ones_count: usize,
    other_indices: Vec<u32>,
    other_scalars: Vec<Fr>,
}

/// Classifies `scalars` (in parallel) into zero / one / other.
pub fn classify(scalars: &[Fr]) -> SplitScalars {
    let ones: Vec<u32> = (scalars.par_chunks(32))
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0, |w, (b, s)| w | u32::from(s.is_one()) << b)
        })
        .collect();
    let (other_indices, other_scalars) = (scalars.par_iter().enumerate())
        .filter(|(_, s)| !s.is_zero() && !s.is_one())
        .map(|(i, s)| (i as u32, *s))
        .unzip();
    let ones_count = ones.iter().map(|w| w.count_ones() as usize).sum();
    SplitScalars {
        len: scalars.len(),
        ones,
        ones_count,
        other_indices,
        other_scalars,
    }
}

impl SplitScalars {
    /// From the prep's [`ScalarClasses`] of `scalars`, without a rescan.
    pub fn from_classes(classes: &ScalarClasses, scalars: &[Fr]) -> Result<Self, CudaError> {
        let len = classes.len;
        let bad = |i: &u32| *i as usize >= len.min(scalars.len());
        if len > MAX_LEN || classes.ones.iter().chain(&classes.others).any(bad) {
            return Err(invalid("scalar classes index past the scalars"));
        }
        let mut ones = vec![0u32; len.div_ceil(32)];
        classes
            .ones
            .iter()
            .for_each(|&i| ones[i as usize / 32] |= 1 << (i % 32));
        Ok(SplitScalars {
            len,
            ones_count: ones.iter().map(|w| w.count_ones() as usize).sum(),
            ones,
            other_scalars: classes
                .others
                .iter()
                .map(|&i| scalars[i as usize])
                .collect(),
            other_indices: classes.others.clone(),
        })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn ones_bitmap(&self) -> Bitmap<'_> {
        Bitmap {
            words: &self.ones,
            len: self.len,
        }
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

// ---------------------------------------------------------------------------------
// Workspace

/// Element counts of a workspace's scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizes {
    max_n: usize,
    /// Digits and sorted entries: windows per pass × max_n.
    entries: usize,
    /// Buckets and counts (offsets: one more): windows per pass × buckets per window.
    keys: usize,
    slices: usize,
    /// Reduction groups / batch-addition parts, and the first fold of those.
    partials: [usize; 2],
}

/// Raw addresses of the scratch one Pippenger pass uses, carved from a workspace's
/// three buffers (scalars, u32 words, points).
#[derive(Clone, Copy, Debug, Default)]
struct Scratch {
    scalars: CUdeviceptr,
    index: CUdeviceptr,
    bitmap: CUdeviceptr,
    digits: CUdeviceptr,
    sorted: CUdeviceptr,
    counts: CUdeviceptr,
    offsets: CUdeviceptr,
    tile_sums: CUdeviceptr,
    head_keys: [CUdeviceptr; 2],
    pts: PointScratch,
    slices: usize,
}

/// The point regions of one Pippenger pass, in one curve's XYZZ points: the buckets,
/// two head buffers and two partial-sum buffers (see [`Sizes::points`]). A second
/// curve's run beside a G1 one ([`Beside`]) has its own, of the same counts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PointScratch {
    buckets: CUdeviceptr,
    head_pts: [CUdeviceptr; 2],
    partials: [CUdeviceptr; 2],
}

impl PointScratch {
    /// Carves the regions of `counts` ([`Sizes::points`]) from `base`, `xyzz` bytes a point.
    pub(crate) fn carve(base: CUdeviceptr, counts: [usize; 5], xyzz: u64) -> PointScratch {
        let at = |i: usize| base + counts[..i].iter().sum::<usize>() as u64 * xyzz;
        PointScratch {
            buckets: at(0),
            head_pts: [at(1), at(2)],
            partials: [at(3), at(4)],
        }
    }
}

/// The kernels of the point stages (c)–(d) for one curve, and its XYZZ size: msm.cu's
/// for G1, g2.cu's for G2. Stages (a)–(b) are scalar work and run once per MSM.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Curve {
    pub module: &'static str,
    pub accumulate_sorted: &'static str,
    pub accumulate_heads: &'static str,
    pub reduce_buckets: &'static str,
    pub sum_chunks: &'static str,
    /// Threads per block of those kernels (their `__launch_bounds__`).
    pub block: u32,
    pub xyzz: u64,
}

/// G1's point stages (`cuda/msm.cu`).
const G1_CURVE: Curve = Curve {
    module: MODULE,
    accumulate_sorted: kernel::ACCUMULATE_SORTED,
    accumulate_heads: kernel::ACCUMULATE_HEADS,
    reduce_buckets: kernel::REDUCE_BUCKETS,
    sum_chunks: kernel::SUM_CHUNKS,
    block: POINT_BLOCK,
    xyzz: XYZZ,
};

/// A second curve's MSM over the same scalars, run beside a G1 Pippenger on its sorted
/// entries (B_G2 beside B_G1): only the point stages run again, with `bases` read
/// through the same base indices; its window sums go to `windows`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Beside {
    pub curve: Curve,
    pub bases: CUdeviceptr,
    pub pts: PointScratch,
    pub windows: CUdeviceptr,
}

impl Sizes {
    /// Scratch for MSMs of up to max_n scalars under `plan` (the largest plan they use).
    fn new(plan: WindowPlan, max_n: usize, windows_per_pass: Option<u32>, slices: usize) -> Sizes {
        let wg = windows_per_pass
            .unwrap_or(plan.windows)
            .clamp(1, plan.windows) as usize;
        let partials = [
            slices.max(MAX_WINDOWS),
            slices.div_ceil(FOLD as usize) + MAX_WINDOWS,
        ];
        Sizes {
            max_n,
            entries: wg * max_n,
            keys: wg * plan.buckets(),
            slices,
            partials,
        }
    }
    /// u32 regions, in carving order: index, bitmap, digits, sorted, counts, offsets,
    /// tile sums, head keys ×2.
    fn words(&self) -> [usize; 9] {
        let (n, k, s) = (self.max_n, self.keys, self.slices);
        [
            n,
            n.div_ceil(32),
            self.entries,
            self.entries,
            k,
            k + 1,
            k.div_ceil(SCAN_TILE),
            s,
            s,
        ]
    }
    /// Point regions: buckets, head points ×2, partials ×2.
    pub(crate) fn points(&self) -> [usize; 5] {
        let (k, s, p) = (self.keys, self.slices, self.partials);
        [k, s, s, p[0], p[1]]
    }
    fn bytes(&self) -> u64 {
        let words: usize = self.words().iter().sum();
        let points: usize = self.points().iter().sum();
        (self.max_n * std::mem::size_of::<DevFr>() + words * 4) as u64 + points as u64 * XYZZ
    }
    fn carve(&self, scalars: CUdeviceptr, words: CUdeviceptr, points: CUdeviceptr) -> Scratch {
        let at = |base: CUdeviceptr, lens: &[usize], i: usize, size: u64| {
            base + lens[..i].iter().sum::<usize>() as u64 * size
        };
        let w = self.words();
        let word = |i| at(words, &w, i, 4);
        Scratch {
            scalars,
            index: word(0),
            bitmap: word(1),
            digits: word(2),
            sorted: word(3),
            counts: word(4),
            offsets: word(5),
            tile_sums: word(6),
            head_keys: [word(7), word(8)],
            pts: PointScratch::carve(points, self.points(), XYZZ),
            slices: self.slices,
        }
    }
}

/// Device scratch for the MSMs of one stream, up to `max_len` scalars each. One MSM at a
/// time: the `*_enqueue` functions take it `&mut`, and each use is ordered after the
/// previous one on the same stream.
#[derive(Debug)]
pub struct MsmWorkspace {
    sizes: Sizes,
    /// Every MSM on this workspace uses this plan (`None`: [`WindowPlan::for_len`]).
    plan: Option<WindowPlan>,
    scratch: Scratch,
    scalars: DeviceBuffer<DevFr>,
    words: DeviceBuffer<u32>,
    points: DeviceBuffer<DevG1Xyzz>,
}

impl MsmWorkspace {
    /// All windows in one pass (the fastest, largest footprint).
    pub fn new(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::with_windows_per_pass(gpu, stream, max_len, None, kind)
    }
    /// All windows in one pass, every MSM with `plan` instead of the planner's choice
    /// (benchmarks and tests of other window widths). `plan` must be
    /// [`WindowPlan::checked`]'s plan for its c.
    pub fn with_plan(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        plan: WindowPlan,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        if WindowPlan::checked(plan.c)? != plan {
            return Err(invalid(format!(
                "window plan {plan:?} is not c-bit windows over 256 bits"
            )));
        }
        Self::build(gpu, stream, max_len, Some(plan), None, kind)
    }
    /// `windows_per_pass` windows of a `max_len` MSM at a time (`None`: all), which
    /// bounds the digit, sort and bucket scratch: the small-card footprint.
    pub fn with_windows_per_pass(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        windows_per_pass: Option<u32>,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::build(gpu, stream, max_len, None, windows_per_pass, kind)
    }
    fn build(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        plan: Option<WindowPlan>,
        windows_per_pass: Option<u32>,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        if max_len > MAX_LEN {
            return Err(invalid(format!(
                "MSM of {max_len} scalars exceeds {MAX_LEN}"
            )));
        }
        let f = gpu.function(MODULE, kernel::ACCUMULATE_SORTED)?;
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(POINT_BLOCK, 0, None)?;
        let resident = (gpu.sm_count()? * per_sm.max(1) * POINT_BLOCK) as usize;
        let sized_for = plan.unwrap_or_else(|| WindowPlan::for_len(max_len));
        let sizes = Sizes::new(
            sized_for,
            max_len,
            windows_per_pass,
            resident.min(MAX_SLICES),
        );
        let mut ws = Self::with_sizes(gpu, stream, sizes, kind)?;
        ws.plan = plan;
        Ok(ws)
    }
    fn with_sizes(gpu: &Gpu, s: &Stream, sizes: Sizes, kind: AllocKind) -> Result<Self, CudaError> {
        let scalars = gpu.alloc::<DevFr>(s, sizes.max_n, kind)?;
        let words = gpu.alloc::<u32>(s, sizes.words().iter().sum(), kind)?;
        let points = gpu.alloc::<DevG1Xyzz>(s, sizes.points().iter().sum(), kind)?;
        let scratch = sizes.carve(scalars.raw(), words.raw(), points.raw());
        Ok(MsmWorkspace {
            sizes,
            plan: None,
            scratch,
            scalars,
            words,
            points,
        })
    }
    /// Device bytes of a workspace for `len` scalars, all windows in one pass (an upper
    /// bound: the accumulation slices are counted at their maximum).
    pub fn bytes_needed(len: usize) -> u64 {
        Self::bytes_needed_with(len, None)
    }
    pub fn bytes_needed_with(len: usize, windows_per_pass: Option<u32>) -> u64 {
        Sizes::new(WindowPlan::for_len(len), len, windows_per_pass, MAX_SLICES).bytes()
    }
    pub fn bytes(&self) -> u64 {
        self.sizes.bytes()
    }
    /// The point counts of this workspace's regions (a [`Beside`] run needs as many).
    pub(crate) fn point_counts(&self) -> [usize; 5] {
        self.sizes.points()
    }
    /// [`MsmWorkspace::point_counts`] of a workspace [`MsmWorkspace::bytes_needed_with`]
    /// sizes (an upper bound, as there).
    pub(crate) fn point_counts_needed(len: usize, windows_per_pass: Option<u32>) -> [usize; 5] {
        Sizes::new(WindowPlan::for_len(len), len, windows_per_pass, MAX_SLICES).points()
    }
    /// The device bitmap of the last batch addition enqueued on this workspace (⌈n/32⌉
    /// words): valid, in stream order, until the next batch addition on it. B_G2's
    /// batch addition reads B_G1's ones from here.
    pub fn ones_bitmap(&self) -> CUdeviceptr {
        self.scratch.bitmap
    }
    pub fn max_len(&self) -> usize {
        self.sizes.max_n
    }
    /// The window plan an MSM of n scalars runs with on this workspace.
    pub fn plan_for(&self, n: usize) -> WindowPlan {
        self.plan.unwrap_or_else(|| WindowPlan::for_len(n))
    }
    /// Fills all scratch with 0xA5 bytes (tests: nothing may read what no stage wrote).
    pub fn poison(&mut self, gpu: &Gpu, stream: &Stream) -> Result<(), CudaError> {
        gpu.poison(stream, &mut self.scalars)?;
        gpu.poison(stream, &mut self.words)?;
        gpu.poison(stream, &mut self.points)
    }
    /// Frees every buffer now, reporting the first error (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        let r = [self.scalars.free(), self.words.free(), self.points.free()];
        r.into_iter().collect()
    }
    /// Windows per pass for an MSM of n > 0 scalars under `plan`.
    fn windows_per_pass(&self, n: usize, plan: WindowPlan) -> Result<u32, CudaError> {
        let fit = (self.sizes.entries / n).min(self.sizes.keys / plan.buckets());
        let wg = fit.min(u32::MAX as usize / n).min(plan.windows as usize) as u32;
        if wg == 0 || n > self.sizes.max_n {
            return Err(invalid(format!(
                "MSM of {n} scalars exceeds the workspace ({})",
                self.sizes.max_n
            )));
        }
        Ok(wg)
    }
}

// ---------------------------------------------------------------------------------
// Launch plumbing

fn cfg_2d(n: usize, y: u32, block: u32) -> Result<LaunchConfig, CudaError> {
    let mut cfg = grid_1d(n, block)?;
    cfg.grid_dim.1 = y.max(1);
    Ok(cfg)
}

/// # Safety
/// `dst` must address `bytes` bytes of live device memory.
unsafe fn zero(gpu: &Gpu, s: &Stream, dst: CUdeviceptr, bytes: usize) -> Result<(), CudaError> {
    gpu.context().bind_to_thread()?;
    // SAFETY: per the contract.
    unsafe { result::memset_d8_async(dst, 0, bytes, s.cu_stream()) }?;
    Ok(())
}

/// Stage markers of an instrumented run (bench only): (stage that just ended, event).
type Clock = Vec<(&'static str, CudaEvent)>;

fn mark(
    gpu: &Gpu,
    s: &Stream,
    clock: &mut Option<&mut Clock>,
    stage: &'static str,
) -> Result<(), CudaError> {
    if let Some(c) = clock.as_deref_mut() {
        let e = gpu
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(s)?;
        c.push((stage, e));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Stage enqueuers. Safety (all): the scratch addresses are live and sized as `Sizes`
// lays them out for the arguments given; bases, indices and outputs as documented.

/// (a) out[i] = canonical(input[i]) for n scalars; `out` may equal `input`.
unsafe fn enqueue_from_montgomery(
    gpu: &Gpu,
    s: &Stream,
    out: CUdeviceptr,
    input: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let n32 = u32_of(n)?;
    // msm_from_montgomery(fr_t* out, const fr_t* in, u32 n)
    launch!(gpu, s, kernel::FROM_MONTGOMERY, grid_1d(n, LIGHT_BLOCK)?; out, input, n32)
}

/// (a) Digits of windows [w0, w0 + wc) of the n canonical scalars in `sc.scalars`.
unsafe fn enqueue_digits(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    n: usize,
    c: u32,
    w0: u32,
    wc: u32,
) -> Result<(), CudaError> {
    let (out, scalars, n32) = (sc.digits, sc.scalars, u32_of(n)?);
    // msm_digits(u32* out, const u32* scalars, u32 n, u32 c, u32 w_begin, u32 w_count)
    launch!(gpu, s, kernel::DIGITS, grid_1d(n, LIGHT_BLOCK)?; out, scalars, n32, c, w0, wc)
}

/// (b) Counting sort of the digits of wc windows into offsets[0..=keys] and the sorted
/// entries; `sc.counts` ends as the cursor. `base_index` 0 is the identity map.
unsafe fn enqueue_sort(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    base_index: CUdeviceptr,
    n: usize,
    c: u32,
    wc: u32,
) -> Result<(), CudaError> {
    let keys = wc as usize * (1usize << (c - 1));
    let tiles = keys.div_ceil(SCAN_TILE);
    let (n32, k32, t32) = (u32_of(n)?, u32_of(keys)?, u32_of(tiles)?);
    let Scratch {
        counts,
        offsets,
        tile_sums,
        digits,
        sorted,
        ..
    } = *sc;
    let tile_grid = grid_1d(tiles * SCAN_THREADS as usize, SCAN_THREADS)?;
    // SAFETY: `counts` holds `keys` u32.
    unsafe { zero(gpu, s, counts, keys * 4) }?;
    // msm_bucket_count(u32* counts, const u32* digits, u32 n, u32 c); grid.y = window
    launch!(gpu, s, kernel::BUCKET_COUNT, cfg_2d(n, wc, LIGHT_BLOCK)?; counts, digits, n32, c)?;
    // msm_scan_reduce(u32* tile_sums, const u32* counts, u32 K)
    launch!(gpu, s, kernel::SCAN_REDUCE, tile_grid; tile_sums, counts, k32)?;
    // msm_scan_tiles(u32* tile_sums, u32 tiles)
    launch!(gpu, s, kernel::SCAN_TILES, grid_1d(1, SCAN_THREADS)?; tile_sums, t32)?;
    // msm_scan_apply(u32* offsets, u32* cursor, const u32* counts, const u32* tile_sums, u32 K)
    launch!(gpu, s, kernel::SCAN_APPLY, tile_grid; offsets, counts, counts, tile_sums, k32)?;
    // msm_bucket_scatter(u32* sorted, u32* cursor, const u32* digits, const u32* base_index,
    //                    u32 n, u32 c); grid.y = window
    launch!(gpu, s, kernel::BUCKET_SCATTER, cfg_2d(n, wc, LIGHT_BLOCK)?; sorted, counts, digits, base_index, n32, c)
}

/// (c) Bucket sums over `slices` (≤ sc.slices) slices of the sorted entries, then the
/// heads folded `fold` at a time, level by level.
/// The sorted entries, offsets and head keys come from `sc`; the points go to `pts`, in
/// `curve`'s points (a second curve rewrites the head keys with the same values).
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_accumulate(
    gpu: &Gpu,
    s: &Stream,
    curve: &Curve,
    sc: &Scratch,
    pts: &PointScratch,
    bases: CUdeviceptr,
    keys: usize,
    slices: usize,
    fold: u32,
) -> Result<(), CudaError> {
    let (k32, s32, block) = (u32_of(keys)?, u32_of(slices)?, curve.block);
    let Scratch {
        sorted,
        offsets,
        head_keys: hk,
        ..
    } = *sc;
    let PointScratch {
        buckets,
        head_pts: hp,
        ..
    } = *pts;
    let (hk0, hp0) = (hk[0], hp[0]);
    // msm_accumulate_sorted(xyzz* buckets, u32* head_keys, xyzz* head_pts, const u32* sorted,
    //                       const u32* offsets, const affine* bases, u32 K, u32 S)
    launch!(@curve.module, gpu, s, curve.accumulate_sorted, grid_1d(slices, block)?; buckets, hk0, hp0, sorted, offsets, bases, k32, s32)?;
    let (mut count, mut i) = (slices, 0);
    while count > 1 {
        let out_count = count.div_ceil(fold as usize);
        let (ok, op, ik, ip, c32) = (hk[1 - i], hp[1 - i], hk[i], hp[i], u32_of(count)?);
        // msm_accumulate_heads(xyzz* buckets, u32* out_keys, xyzz* out_pts, const u32* in_keys,
        //                      const xyzz* in_pts, u32 count, u32 T)
        launch!(@curve.module, gpu, s, curve.accumulate_heads, grid_1d(out_count, block)?; buckets, ok, op, ik, ip, c32, fold)?;
        (count, i) = (out_count, 1 - i);
    }
    Ok(())
}

/// Buckets per reduction thread: about `slices` groups in all, a power of two ≤ NB.
fn reduction_span(plan: WindowPlan, wc: u32, slices: usize) -> u32 {
    let want = (wc as usize * plan.buckets()).div_ceil(slices.max(1));
    want.next_power_of_two().min(plan.buckets()) as u32
}

/// (d) Window sums of wc windows into out[0..wc]: running sums per group of `span`
/// buckets into partials[0], then folded.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_reduce(
    gpu: &Gpu,
    s: &Stream,
    curve: &Curve,
    sc: &Scratch,
    pts: &PointScratch,
    out: CUdeviceptr,
    (c, wc, span): (u32, u32, u32),
) -> Result<(), CudaError> {
    let groups = (1usize << (c - 1)) / span as usize;
    let (offsets, buckets, p0) = (sc.offsets, pts.buckets, pts.partials[0]);
    // msm_reduce_buckets(xyzz* out, const xyzz* buckets, const u32* offsets, u32 c, u32 w_count, u32 L)
    launch!(@curve.module, gpu, s, curve.reduce_buckets, grid_1d(wc as usize * groups, curve.block)?; p0, buckets, offsets, c, wc, span)?;
    // SAFETY: forwarded.
    unsafe { enqueue_fold(gpu, s, curve, pts, out, groups, wc) }
}

/// out[g] = Σ partials[0][g·len .. (g+1)·len) for `groups` groups, FOLD points per
/// thread and pass, ping-ponging between the two partials buffers.
unsafe fn enqueue_fold(
    gpu: &Gpu,
    s: &Stream,
    curve: &Curve,
    pts: &PointScratch,
    out: CUdeviceptr,
    mut len: usize,
    groups: u32,
) -> Result<(), CudaError> {
    let mut i = 0;
    loop {
        let out_len = len.div_ceil(FOLD as usize);
        let (src, l32) = (pts.partials[i], u32_of(len)?);
        let dst = if out_len == 1 {
            out
        } else {
            pts.partials[1 - i]
        };
        // msm_sum_chunks(xyzz* out, const xyzz* in, u32 len, u32 chunk); grid.y = group
        launch!(@curve.module, gpu, s, curve.sum_chunks, cfg_2d(out_len, groups, curve.block)?; dst, src, l32, FOLD)?;
        if out_len == 1 {
            return Ok(());
        }
        (len, i) = (out_len, 1 - i);
    }
}

/// One Pippenger run over the n canonical scalars already in `scalars` of the scratch.
struct Run {
    bases: CUdeviceptr,
    n: usize,
    /// Base of scalar i: base_index[i] (0: i).
    base_index: CUdeviceptr,
    /// Where the window sums go (the plan's W points).
    windows: CUdeviceptr,
    /// A second curve's MSM on the same scalars, window group by window group.
    beside: Option<Beside>,
}

/// Stages (a)–(d): the window sums of `run` into `run.windows`. Returns the plan they
/// were made with (None for n = 0: no windows, nothing enqueued).
unsafe fn enqueue_pippenger(
    gpu: &Gpu,
    s: &Stream,
    ws: &MsmWorkspace,
    run: Run,
    mut clock: Option<&mut Clock>,
) -> Result<Option<WindowPlan>, CudaError> {
    let Run {
        bases,
        n,
        base_index,
        windows,
        beside,
    } = run;
    if n == 0 {
        return Ok(None);
    }
    let (plan, sc) = (ws.plan_for(n), &ws.scratch);
    let wg = ws.windows_per_pass(n, plan)?;
    for w0 in (0..plan.windows).step_by(wg as usize) {
        let wc = wg.min(plan.windows - w0);
        let slices = (wc as usize * n).div_ceil(4).clamp(1, sc.slices);
        let span = reduction_span(plan, wc, sc.slices);
        // SAFETY: `windows_per_pass` sized wc windows of n scalars to fit the scratch.
        unsafe {
            enqueue_digits(gpu, s, sc, n, plan.c, w0, wc)?;
            mark(gpu, s, &mut clock, "digits")?;
            enqueue_sort(gpu, s, sc, base_index, n, plan.c, wc)?;
            mark(gpu, s, &mut clock, "sort")?;
            let keys = wc as usize * plan.buckets();
            enqueue_accumulate(gpu, s, &G1_CURVE, sc, &sc.pts, bases, keys, slices, FOLD)?;
            mark(gpu, s, &mut clock, "accumulate")?;
            let at = windows + u64::from(w0) * XYZZ;
            enqueue_reduce(gpu, s, &G1_CURVE, sc, &sc.pts, at, (plan.c, wc, span))?;
            mark(gpu, s, &mut clock, "reduce")?;
            if let Some(b) = &beside {
                // The same sorted entries over the second curve's bases; the caller
                // sized its points like the workspace's (`point_counts`).
                enqueue_accumulate(gpu, s, &b.curve, sc, &b.pts, b.bases, keys, slices, FOLD)?;
                let at = b.windows + u64::from(w0) * b.curve.xyzz;
                enqueue_reduce(gpu, s, &b.curve, sc, &b.pts, at, (plan.c, wc, span))?;
                mark(gpu, s, &mut clock, "beside")?;
            }
        }
    }
    Ok(Some(plan))
}

/// *out = Σ bases[i] over the set bits i < n of the bitmap at `sc.bitmap`.
unsafe fn enqueue_batch_add(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    bases: CUdeviceptr,
    n: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    if n == 0 {
        // SAFETY: `out` is one point.
        return unsafe { zero(gpu, s, out, XYZZ as usize) };
    }
    let words = n.div_ceil(32);
    let per = words.div_ceil(sc.slices);
    let parts = words.div_ceil(per);
    let (p0, bitmap, n32, per32) = (sc.pts.partials[0], sc.bitmap, u32_of(n)?, u32_of(per)?);
    // msm_batch_add_bitmap(xyzz* out, const affine* bases, const u32* bitmap, u32 n, u32 words)
    launch!(gpu, s, kernel::BATCH_ADD_BITMAP, grid_1d(parts, POINT_BLOCK)?; p0, bases, bitmap, n32, per32)?;
    // SAFETY: parts ≤ slices ≤ partials[0]; the first fold fits partials[1].
    unsafe { enqueue_fold(gpu, s, &G1_CURVE, &sc.pts, out, parts, 1) }
}

// ---------------------------------------------------------------------------------
// Public entry points

/// Points per result slot: the accumulator and up to [`MAX_WINDOWS`] window sums.
pub const RECORD: usize = 1 + MAX_WINDOWS;

/// Result slots on the device, one per MSM. The device writes each slot's accumulator
/// (a batch addition's sum, or zero) and its window sums W_w; [`read_points`] finishes
/// on the host, acc + Σ_w 2^(cw)·W_w. That Horner chain of c·(W − 1) dependent
/// doublings took 8.6 ms as one GPU thread (at every size, since W·c ≈ 256) and takes
/// about 0.1 ms on one CPU core.
#[derive(Debug)]
pub struct MsmResults {
    buf: DeviceBuffer<DevG1Xyzz>,
    /// The plan each slot's window sums were made with (None: the accumulator only).
    plans: Vec<Option<WindowPlan>>,
}

impl MsmResults {
    pub fn alloc(gpu: &Gpu, s: &Stream, slots: usize, kind: AllocKind) -> Result<Self, CudaError> {
        let len = slots
            .checked_mul(RECORD)
            .ok_or_else(|| invalid(format!("{slots} result slots")))?;
        Ok(MsmResults {
            buf: gpu.alloc(s, len, kind)?,
            plans: vec![None; slots],
        })
    }
    pub fn bytes_needed(slots: usize) -> u64 {
        (slots * RECORD) as u64 * XYZZ
    }
    pub fn slots(&self) -> usize {
        self.plans.len()
    }
    /// Fills every slot with 0xA5 bytes: a slot the device never wrote reads as an error.
    pub fn poison(&mut self, gpu: &Gpu, s: &Stream) -> Result<(), CudaError> {
        self.plans.fill(None);
        gpu.poison(s, &mut self.buf)
    }
    pub fn free(self) -> Result<(), CudaError> {
        self.buf.free()
    }
    /// The device address of slot `index`'s record; forgets the slot's previous plan.
    fn record(&mut self, index: usize) -> Result<CUdeviceptr, CudaError> {
        let Some(plan) = self.plans.get_mut(index) else {
            return Err(invalid(format!("result slot {index} of {}", self.slots())));
        };
        *plan = None;
        Ok(self.buf.raw() + (index * RECORD) as u64 * XYZZ)
    }
}

/// Stage (e) on the host: Σ_w 2^(cw)·sums[w], by Horner from the top window down.
pub fn combine_windows<G: CurveGroup>(sums: &[G], c: u32) -> G {
    sums.iter().rev().fold(G::zero(), |mut acc, w| {
        if !acc.is_zero() {
            for _ in 0..c {
                acc.double_in_place();
            }
        }
        acc + w
    })
}

/// Puts the scalars' canonical integers in the workspace: copied from the host, or read
/// in place from the device, then converted.
fn stage_scalars(
    gpu: &Gpu,
    s: &Stream,
    ws: &mut MsmWorkspace,
    scalars: ScalarsRef<'_>,
) -> Result<(), CudaError> {
    let (n, dst) = (scalars.len(), ws.scratch.scalars);
    if n > ws.sizes.max_n {
        return Err(invalid(format!(
            "MSM of {n} scalars exceeds the workspace ({})",
            ws.sizes.max_n
        )));
    }
    let src = match scalars {
        // SAFETY: the workspace holds max_n ≥ n scalars.
        ScalarsRef::Host(h) => unsafe { upload(gpu, s, dst, fr_as_dev(h)) }.map(|()| dst)?,
        ScalarsRef::Pinned(p) => s.memcpy_htod(p, &mut ws.scalars).map(|()| dst)?,
        ScalarsRef::Device(d) => d.ptr,
    };
    if n == 0 {
        return Ok(());
    }
    // SAFETY: both hold n scalars (a device source per `DeviceScalars`' contract).
    unsafe { enqueue_from_montgomery(gpu, s, dst, src, n) }
}

/// Enqueues Σ scalars_i·bases_i into `out[index]`. Extra bases are ignored (as in
/// arkworks' `msm_bigint`); fewer bases than scalars is an error.
pub fn msm_enqueue(
    gpu: &Gpu,
    stream: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    scalars: ScalarsRef<'_>,
    out: &mut MsmResults,
    index: usize,
) -> Result<(), CudaError> {
    let n = scalars.len();
    if n > bases.len {
        return Err(invalid(format!("{n} scalars but {} bases", bases.len)));
    }
    let rec = out.record(index)?;
    stage_scalars(gpu, stream, ws, scalars)?;
    let run = Run {
        bases: bases.ptr,
        n,
        base_index: 0,
        windows: rec + XYZZ,
        beside: None,
    };
    // SAFETY: the record holds RECORD points (the accumulator, then ≤ MAX_WINDOWS
    // window sums); bases hold ≥ n points.
    let plan = unsafe {
        zero(gpu, stream, rec, XYZZ as usize)?;
        enqueue_pippenger(gpu, stream, ws, run, None)?
    };
    out.plans[index] = plan;
    Ok(())
}

/// Bits 0..len of a bitmap: bit i is bit i % 32 of `words[i / 32]`; bits past `len`
/// are ignored.
#[derive(Clone, Copy, Debug)]
pub struct Bitmap<'a> {
    pub words: &'a [u32],
    pub len: usize,
}

/// Enqueues Σ bases_i over the set bits of `ones` into `out[index]`.
pub fn batch_add_enqueue(
    gpu: &Gpu,
    stream: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    ones: Bitmap<'_>,
    out: &mut MsmResults,
    index: usize,
) -> Result<(), CudaError> {
    let len = ones.len;
    let words = ones.words.get(..len.div_ceil(32));
    let Some(words) = words.filter(|_| len <= bases.len && len <= ws.sizes.max_n) else {
        let (m, w) = (ws.sizes.max_n, ones.words.len());
        let msg = format!(
            "batch add of {len}: {} bases, workspace {m}, {w} words",
            bases.len
        );
        return Err(invalid(msg));
    };
    let rec = out.record(index)?;
    // SAFETY: the bitmap region holds ⌈max_n/32⌉ words; bases ≥ len points; the
    // record's first point is the accumulator.
    unsafe {
        upload(gpu, stream, ws.scratch.bitmap, words)?;
        enqueue_batch_add(gpu, stream, &ws.scratch, bases.ptr, len, rec)
    }
}

/// Enqueues the split MSM into `out[index]`: batch addition over the ones, plus
/// Pippenger over the others with their bases read through the index list.
pub fn msm_split_enqueue(
    gpu: &Gpu,
    stream: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    split: &SplitScalars,
    out: &mut MsmResults,
    index: usize,
) -> Result<(), CudaError> {
    // SAFETY: no second curve.
    unsafe { msm_split_beside_enqueue(gpu, stream, ws, bases, split, out, index, None) }.map(drop)
}

/// [`msm_split_enqueue`], with `beside`'s MSM of the others on the same sorted entries
/// (B_G2 beside B_G1). Returns the plan of the others' windows (None: no others).
///
/// # Safety
/// `beside`'s bases hold at least `split.len` points and its point regions the
/// workspace's [`MsmWorkspace::point_counts`], its windows [`MAX_WINDOWS`] points, all
/// live until the stream has run the work.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn msm_split_beside_enqueue(
    gpu: &Gpu,
    stream: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    split: &SplitScalars,
    out: &mut MsmResults,
    index: usize,
    beside: Option<Beside>,
) -> Result<Option<WindowPlan>, CudaError> {
    let ones = Bitmap {
        words: &split.ones,
        len: split.len,
    };
    batch_add_enqueue(gpu, stream, ws, bases, ones, out, index)?;
    let rec = out.record(index)?;
    let n = split.other_indices.len();
    stage_scalars(gpu, stream, ws, ScalarsRef::Host(&split.other_scalars))?;
    let run = Run {
        bases: bases.ptr,
        n,
        base_index: ws.scratch.index,
        windows: rec + XYZZ,
        beside,
    };
    // SAFETY: the index region holds max_n ≥ n entries, each < split.len ≤ bases.len
    // (and ≤ the second curve's bases, per the caller); the window sums follow the
    // accumulator in the record.
    let plan = unsafe {
        upload(gpu, stream, ws.scratch.index, &split.other_indices)?;
        enqueue_pippenger(gpu, stream, ws, run, None)?
    };
    out.plans[index] = plan;
    Ok(plan)
}

/// Waits for `stream` (checked), converts every slot of `out` and finishes it on the
/// host (accumulator + combined windows). A point that is not of G1 (unreduced
/// coordinates, ZZ ≠ 0 with ZZZ = 0, or off the curve), e.g. a slot the device never
/// wrote, is an error.
pub fn read_points(
    gpu: &Gpu,
    stream: &Stream,
    out: &MsmResults,
) -> Result<Vec<G1Projective>, CudaError> {
    let mut host = vec![DevG1Xyzz::default(); out.buf.len()];
    // SAFETY: `out.buf` holds host.len() points; every bit pattern is a valid DevG1Xyzz.
    unsafe { download(gpu, stream, out.buf.raw(), &mut host) }?;
    (host.chunks(RECORD).zip(&out.plans).enumerate())
        .map(|(i, (rec, plan))| {
            let acc = to_point(&rec[0], i)?;
            let Some(plan) = plan else {
                return Ok(acc);
            };
            let sums = (rec.get(1..=plan.windows as usize))
                .ok_or_else(|| invalid(format!("slot {i}: {} windows", plan.windows)))?
                .iter()
                .map(|d| to_point(d, i))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(acc + combine_windows(&sums, plan.c))
        })
        .collect()
}

fn to_point(d: &DevG1Xyzz, i: usize) -> Result<G1Projective, CudaError> {
    let zero = |f: &super::layout::DevFq| f.0 == [0; 6];
    (xyzz_to_projective(d))
        .filter(|p| (zero(&d.zz) || !zero(&d.zzz)) && on_curve(p))
        .ok_or_else(|| invalid(format!("device MSM result {i} is not a point of G1: {d:?}")))
}

/// y² = x³ + 4 in Jacobian coordinates (Y² = X³ + 4·Z⁶), without an inversion.
fn on_curve(p: &G1Projective) -> bool {
    let z2 = p.z.square();
    let z6 = z2.square() * z2;
    p.y.square() == p.x.square() * p.x + z6.double().double()
}

/// Runs `enqueue` with a workspace for `len` scalars and a poisoned one-point output,
/// waits, frees both (and waits for the frees), and returns the point.
fn run_once(
    gpu: &Gpu,
    s: &Stream,
    len: usize,
    enqueue: impl FnOnce(&mut MsmWorkspace, &mut MsmResults) -> Result<(), CudaError>,
) -> Result<G1Projective, CudaError> {
    let mut ws = MsmWorkspace::new(gpu, s, len, AllocKind::StreamOrdered)?;
    let mut out = MsmResults::alloc(gpu, s, 1, AllocKind::StreamOrdered)?;
    out.poison(gpu, s)?;
    let run = enqueue(&mut ws, &mut out).and_then(|()| read_points(gpu, s, &out));
    let freed = ws
        .free()
        .and(out.free())
        .and_then(|()| gpu.sync(s, "msm scratch free"));
    let point = run?.pop().ok_or_else(|| invalid("no MSM result"))?;
    freed.map(|()| point)
}

/// Σ scalars_i·bases_i (scratch allocated and freed inside).
pub fn msm(
    gpu: &Gpu,
    stream: &Stream,
    bases: BasesView<'_>,
    scalars: ScalarsRef<'_>,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, scalars.len(), |ws, out| {
        msm_enqueue(gpu, stream, ws, bases, scalars, out, 0)
    })
}

/// Σ bases_i over the set bits of `ones` (scratch allocated and freed inside).
pub fn batch_add(
    gpu: &Gpu,
    stream: &Stream,
    bases: BasesView<'_>,
    ones: Bitmap<'_>,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, ones.len, |ws, out| {
        batch_add_enqueue(gpu, stream, ws, bases, ones, out, 0)
    })
}

/// The split MSM of `split`'s scalars (scratch allocated and freed inside).
pub fn msm_split(
    gpu: &Gpu,
    stream: &Stream,
    bases: BasesView<'_>,
    split: &SplitScalars,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, split.len, |ws, out| {
        msm_split_enqueue(gpu, stream, ws, bases, split, out, 0)
    })
}

// ---------------------------------------------------------------------------------
// Test data and the benchmark

/// n bases fast: P_(i+1) = P_i + D from random P_0 and D, walked in parallel chunks (one
/// scalar multiplication per chunk) and batch-normalized.
pub fn walk_bases(n: usize, seed: u64) -> Vec<G1Affine> {
    walk_points::<G1Projective>(n, seed)
}

/// [`walk_bases`] on any curve group (the G2 tests use it too).
pub fn walk_points<G: CurveGroup<ScalarField = Fr>>(n: usize, seed: u64) -> Vec<G::Affine> {
    const CHUNK: usize = 1 << 14;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let (p0, d) = (G::rand(&mut rng), G::rand(&mut rng));
    let step = d * Fr::from(CHUNK as u64);
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .flat_map_iter(|j| {
            let start = p0 + step * Fr::from(j as u64);
            let walk = std::iter::successors(Some(start), |p| Some(*p + d));
            G::normalize_batch(&walk.take(CHUNK.min(n - j * CHUNK)).collect::<Vec<_>>())
        })
        .collect()
}

/// n uniform scalars, generated in parallel chunks from `seed`.
pub fn random_scalars(n: usize, seed: u64) -> Vec<Fr> {
    const CHUNK: usize = 1 << 16;
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .flat_map_iter(|j| {
            let chunk_seed = seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(chunk_seed);
            (0..CHUNK.min(n - j * CHUNK)).map(move |_| Fr::rand(&mut rng))
        })
        .collect()
}

/// Device timing of one MSM size: resident bases, pinned host scalars, the copy of
/// the scalars included.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MsmTiming {
    pub log_n: u32,
    pub plan: WindowPlan,
    /// Timed runs after the warm-up.
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// The host's finish per run (median; included in the run times above): the
    /// download of the window sums and stage (e), their combination on the CPU.
    pub finish_ms: f64,
    /// Device ms per stage of one more run, summed over window passes ("scalars" is
    /// the copy and the conversion), then the host's "finish".
    pub stages_ms: Vec<(String, f64)>,
    /// Every run returned the same point (a point that moves between runs is a race).
    pub consistent: bool,
    pub workspace_bytes: u64,
    /// The point of the first run, to check against the peers.
    #[serde(skip)]
    pub result: Option<G1Projective>,
}

/// Times [`msm_enqueue`] at each size: a warm-up, then `runs` (at least 3) runs, each
/// the device time between CUDA events plus the host's finish ([`read_points`]),
/// median reported. Bases (a random walk) are uploaded once for the
/// largest size; the workspace is allocated once, outside the timing.
pub fn bench_msm(gpu: &Gpu, log_sizes: &[u32], runs: usize) -> Result<Vec<MsmTiming>, CudaError> {
    bench_msm_with_bits(gpu, log_sizes, runs, None)
}

/// [`bench_msm`] with every MSM on `window_bits`-bit windows (`None`: the planner's
/// choice per size); c outside [`MIN_WINDOW_BITS`]..=[`MAX_WINDOW_BITS`] is an error.
pub fn bench_msm_with_bits(
    gpu: &Gpu,
    log_sizes: &[u32],
    runs: usize,
    window_bits: Option<u32>,
) -> Result<Vec<MsmTiming>, CudaError> {
    let plan = window_bits.map(WindowPlan::checked).transpose()?;
    let runs = runs.max(3);
    let Some(&max_log) = log_sizes.iter().max() else {
        return Ok(Vec::new());
    };
    if max_log > 28 {
        return Err(invalid(format!(
            "bench size 2^{max_log} unsupported (at most 2^28)"
        )));
    }
    let s = gpu.new_stream()?;
    let kind = AllocKind::StreamOrdered;
    let bases = DeviceBases::upload(gpu, &s, &walk_bases(1 << max_log, 1), kind)?;
    let mut ws = match plan {
        Some(p) => MsmWorkspace::with_plan(gpu, &s, 1 << max_log, p, kind)?,
        None => MsmWorkspace::new(gpu, &s, 1 << max_log, kind)?,
    };
    let mut out = MsmResults::alloc(gpu, &s, 1, kind)?;
    let mut timings = Vec::with_capacity(log_sizes.len());
    for &log_n in log_sizes {
        let n = 1usize << log_n;
        // SAFETY: every element is written below before any read.
        let mut pinned = unsafe { gpu.context().alloc_pinned::<DevFr>(n) }?;
        pinned
            .as_mut_slice()?
            .copy_from_slice(fr_as_dev(&random_scalars(n, u64::from(log_n))));
        let (mut times, mut finish, mut first, mut consistent) =
            (Vec::with_capacity(runs), Vec::new(), None, true);
        for run in 0..=runs {
            let scalars = ScalarsRef::Pinned(&pinned);
            let enqueue = || msm_enqueue(gpu, &s, &mut ws, bases.view(), scalars, &mut out, 0);
            let ms = time_on_stream(gpu, &s, enqueue)?;
            let (p, host_ms) = timed_read(gpu, &s, &out)?;
            consistent &= *first.get_or_insert(p) == p;
            if run > 0 {
                times.push(ms + host_ms);
                finish.push(host_ms);
            }
        }
        let stages_ms = staged_run(gpu, &s, &mut ws, bases.view(), &pinned, &mut out)?;
        consistent &= Some(read_points(gpu, &s, &out)?[0]) == first;
        let (min_ms, max_ms) = times
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &t| (a.min(t), b.max(t)));
        let (plan, median_ms, workspace_bytes) = (ws.plan_for(n), median(&mut times), ws.bytes());
        timings.push(MsmTiming {
            log_n,
            plan,
            runs,
            median_ms,
            min_ms,
            max_ms,
            finish_ms: median(&mut finish),
            stages_ms,
            consistent,
            workspace_bytes,
            result: first,
        });
    }
    let freed = [ws.free(), out.free(), bases.free()];
    freed.into_iter().collect::<Result<(), _>>()?;
    gpu.sync(&s, "msm bench free")?;
    Ok(timings)
}

/// [`read_points`] of a one-slot result, with its wall time in ms.
fn timed_read(gpu: &Gpu, s: &Stream, out: &MsmResults) -> Result<(G1Projective, f64), CudaError> {
    let start = std::time::Instant::now();
    let p = read_points(gpu, s, out)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((
        p.first().copied().ok_or_else(|| invalid("no MSM result"))?,
        ms,
    ))
}

/// One MSM with an event after each stage; device ms per stage name, in order, then
/// the host's finish.
fn staged_run(
    gpu: &Gpu,
    s: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    scalars: &PinnedHostSlice<DevFr>,
    out: &mut MsmResults,
) -> Result<Vec<(String, f64)>, CudaError> {
    let mut clock: Clock = Vec::new();
    mark(gpu, s, &mut Some(&mut clock), "start")?;
    stage_scalars(gpu, s, ws, ScalarsRef::Pinned(scalars))?;
    mark(gpu, s, &mut Some(&mut clock), "scalars")?;
    let rec = out.record(0)?;
    let run = Run {
        bases: bases.ptr,
        n: scalars.len(),
        base_index: 0,
        windows: rec + XYZZ,
        beside: None,
    };
    // SAFETY: bases hold 2^max_log ≥ n points; `rec` is a live record.
    out.plans[0] = unsafe {
        zero(gpu, s, rec, XYZZ as usize)?;
        enqueue_pippenger(gpu, s, ws, run, Some(&mut clock))?
    };
    gpu.sync(s, "msm staged run")?;
    let mut stages: Vec<(String, f64)> = Vec::new();
    for pair in clock.windows(2) {
        let ms = f64::from(pair[0].1.elapsed_ms(&pair[1].1)?);
        match stages.iter_mut().find(|(name, _)| name == pair[1].0) {
            Some((_, t)) => *t += ms,
            None => stages.push((pair[1].0.to_owned(), ms)),
        }
    }
    stages.push(("finish (host)".into(), timed_read(gpu, s, out)?.1));
    Ok(stages)
}

// ---------------------------------------------------------------------------------
// Stages alone

/// Each pipeline stage alone, host data in and out, through the pipeline's enqueuers on
/// a workspace sized for the call (the per-stage tests). The whole workspace is
/// poisoned (0xA5) first, so an output a kernel fails to write, or scratch a kernel
/// reads before anything wrote it, is caught.
pub mod stages {
    use super::*;
    use crate::device::cuda::layout::{projective_to_xyzz, DevFq};

    /// A poisoned workspace of the given sizes (max_n, entries, keys, slices).
    fn workspace(
        gpu: &Gpu,
        s: &Stream,
        (n, e, k, sl): (usize, usize, usize, usize),
    ) -> Result<MsmWorkspace, CudaError> {
        let partials = [
            sl.max(k).max(MAX_WINDOWS),
            sl.max(k).div_ceil(FOLD as usize) + MAX_WINDOWS,
        ];
        let sizes = Sizes {
            max_n: n,
            entries: e,
            keys: k,
            slices: sl,
            partials,
        };
        let mut ws = MsmWorkspace::with_sizes(gpu, s, sizes, AllocKind::StreamOrdered)?;
        ws.poison(gpu, s)?;
        Ok(ws)
    }
    fn get<T: Clone + Default>(
        gpu: &Gpu,
        s: &Stream,
        src: CUdeviceptr,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut host = vec![T::default(); len];
        // SAFETY: callers pass a scratch region of at least `len` values.
        unsafe { download(gpu, s, src, &mut host) }?;
        Ok(host)
    }
    fn put<T>(gpu: &Gpu, s: &Stream, dst: CUdeviceptr, host: &[T]) -> Result<(), CudaError> {
        // SAFETY: callers pass a scratch region of at least host.len() values.
        unsafe { upload(gpu, s, dst, host) }
    }

    /// (a) Canonical limbs of each scalar.
    pub fn from_montgomery(
        gpu: &Gpu,
        s: &Stream,
        scalars: &[Fr],
    ) -> Result<Vec<[u64; 4]>, CudaError> {
        let n = scalars.len();
        let mut ws = workspace(gpu, s, (n, 0, 1, 1))?;
        stage_scalars(gpu, s, &mut ws, ScalarsRef::Host(scalars))?;
        Ok(get::<DevFr>(gpu, s, ws.scratch.scalars, n)?
            .into_iter()
            .map(|d| d.0)
            .collect())
    }

    /// (a) Encoded digits of windows [w0, w0 + wc), window-major.
    pub fn digits(
        gpu: &Gpu,
        s: &Stream,
        canonical: &[[u64; 4]],
        plan: WindowPlan,
        w0: u32,
        wc: u32,
    ) -> Result<Vec<u32>, CudaError> {
        let (n, entries) = (canonical.len(), canonical.len() * wc as usize);
        let ws = workspace(gpu, s, (n, entries, 1, 1))?;
        put(gpu, s, ws.scratch.scalars, canonical)?;
        if n > 0 {
            // SAFETY: digits hold wc·n entries, scalars n.
            unsafe { enqueue_digits(gpu, s, &ws.scratch, n, plan.c, w0, wc) }?;
        }
        get(gpu, s, ws.scratch.digits, entries)
    }

    /// (b) output: offsets[0..=K] and the sorted entries (offsets[K] of them).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Sorted {
        pub offsets: Vec<u32>,
        pub entries: Vec<u32>,
    }

    /// (b) Counting sort of wc windows of n digits (`digits` window-major).
    pub fn bucket_sort(
        gpu: &Gpu,
        s: &Stream,
        digits: &[u32],
        (n, c, wc): (usize, u32, u32),
        base_index: Option<&[u32]>,
    ) -> Result<Sorted, CudaError> {
        let keys = wc as usize * (1usize << (c - 1));
        if n == 0 || digits.len() != n * wc as usize || base_index.is_some_and(|b| b.len() != n) {
            return Err(invalid("bucket_sort: digit or index count"));
        }
        let ws = workspace(gpu, s, (n, digits.len(), keys, 1))?;
        put(gpu, s, ws.scratch.digits, digits)?;
        let index = base_index
            .map(|b| put(gpu, s, ws.scratch.index, b))
            .transpose()?;
        let idx = index.map_or(0, |()| ws.scratch.index);
        // SAFETY: the workspace is sized for wc windows of n digits.
        unsafe { enqueue_sort(gpu, s, &ws.scratch, idx, n, c, wc) }?;
        let offsets: Vec<u32> = get(gpu, s, ws.scratch.offsets, keys + 1)?;
        let total = (offsets[keys] as usize).min(digits.len());
        Ok(Sorted {
            entries: get(gpu, s, ws.scratch.sorted, total)?,
            offsets,
        })
    }

    /// (c) Bucket sums (infinity for an empty bucket) with `slices` accumulation threads
    /// and `fold` heads per thread and level (small values force a deep head tree).
    pub fn accumulate(
        gpu: &Gpu,
        s: &Stream,
        bases: BasesView<'_>,
        sorted: &Sorted,
        (slices, fold): (usize, u32),
    ) -> Result<Vec<G1Projective>, CudaError> {
        let keys = sorted.offsets.len().saturating_sub(1);
        let bad_index = sorted
            .entries
            .iter()
            .any(|e| (e & 0x7fff_ffff) as usize >= bases.len);
        if keys == 0 || slices == 0 || fold < 2 || bad_index {
            return Err(invalid("accumulate: keys, slices, fold or an index"));
        }
        let ws = workspace(gpu, s, (0, sorted.entries.len(), keys, slices))?;
        put(gpu, s, ws.scratch.offsets, &sorted.offsets)?;
        put(gpu, s, ws.scratch.sorted, &sorted.entries)?;
        // SAFETY: the workspace is sized for `keys` buckets and `slices` heads.
        let (sc, curve) = (&ws.scratch, &G1_CURVE);
        unsafe { enqueue_accumulate(gpu, s, curve, sc, &sc.pts, bases.ptr, keys, slices, fold) }?;
        let host: Vec<DevG1Xyzz> = get(gpu, s, ws.scratch.pts.buckets, keys)?;
        let empty = |k: usize| sorted.offsets[k] == sorted.offsets[k + 1];
        (0..keys)
            .map(|k| {
                if empty(k) {
                    Ok(G1Projective::zero())
                } else {
                    to_point(&host[k], k)
                }
            })
            .collect()
    }

    /// (d) Window sums Σ_j j·B_j of wc windows of 2^(c−1) buckets, `span` buckets per
    /// thread. Zero buckets are marked empty and their slots poisoned.
    pub fn reduce(
        gpu: &Gpu,
        s: &Stream,
        buckets: &[G1Projective],
        (c, wc, span): (u32, u32, u32),
    ) -> Result<Vec<G1Projective>, CudaError> {
        let nb = 1usize << (c - 1);
        if buckets.len() != wc as usize * nb || !span.is_power_of_two() || span as usize > nb {
            return Err(invalid("reduce: bucket count or span"));
        }
        let mut offsets = vec![0u32];
        for b in buckets {
            offsets.push(offsets[offsets.len() - 1] + u32::from(!b.is_zero()));
        }
        let poison = DevFq([0xa5a5_a5a5_a5a5_a5a5; 6]);
        let poisoned = DevG1Xyzz {
            x: poison,
            y: poison,
            zz: poison,
            zzz: poison,
        };
        let dev: Vec<DevG1Xyzz> = buckets
            .iter()
            .map(|b| {
                if b.is_zero() {
                    poisoned
                } else {
                    projective_to_xyzz(b)
                }
            })
            .collect();
        let ws = workspace(gpu, s, (0, 0, buckets.len(), 1))?;
        let mut sums = gpu.alloc::<DevG1Xyzz>(s, wc as usize, AllocKind::StreamOrdered)?;
        gpu.poison(s, &mut sums)?;
        put(gpu, s, ws.scratch.pts.buckets, &dev)?;
        put(gpu, s, ws.scratch.offsets, &offsets)?;
        // SAFETY: partials hold ≥ keys ≥ wc·NB/span groups; `sums` wc points.
        let (sc, curve) = (&ws.scratch, &G1_CURVE);
        unsafe { enqueue_reduce(gpu, s, curve, sc, &sc.pts, sums.raw(), (c, wc, span)) }?;
        let host: Vec<DevG1Xyzz> = get(gpu, s, sums.raw(), wc as usize)?;
        sums.free()?;
        host.iter()
            .enumerate()
            .map(|(i, d)| to_point(d, i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ec::AffineRepr;
    use ark_ff::{BigInteger, Field, PrimeField};

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
        // Capped at MAX_PLANNED_WINDOW_BITS from 2^20 up (the model alone picks 18 at
        // 2^22 and 20 at 2^24).
        for log in [20, 22, 24, 28] {
            assert_eq!(WindowPlan::for_len(1 << log).c, MAX_PLANNED_WINDOW_BITS);
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
            assert_eq!(
                a,
                SplitScalars::from_classes(&ScalarClasses::classify(&s), &s).unwrap()
            );
            assert_eq!(
                a.zeros_count() + a.ones_count() + a.other_indices().len(),
                n
            );
            for (i, x) in s.iter().enumerate() {
                assert_eq!(
                    a.ones_bitmap().words[i / 32] >> (i % 32) & 1 == 1,
                    x.is_one()
                );
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
    fn msm_workspace_layout() {
        assert!(MsmWorkspace::bytes_needed(1 << 16) < MsmWorkspace::bytes_needed(1 << 20));
        assert!(
            MsmWorkspace::bytes_needed_with(1 << 24, Some(2)) < MsmWorkspace::bytes_needed(1 << 24)
        );
        // An explicit plan sizes the buckets: keys = windows × 2^(c−1).
        let p18 = WindowPlan::with_bits(18);
        let sizes = Sizes::new(p18, 1 << 14, None, 500);
        assert_eq!(sizes.keys, p18.windows as usize * p18.buckets());
        assert_eq!(sizes.entries, p18.windows as usize * (1 << 14));
        // Regions are disjoint and in bounds: each starts where the previous ends.
        let sizes = Sizes::new(WindowPlan::for_len(1000), 1000, None, 500);
        let sc = sizes.carve(1 << 40, 1 << 41, 1 << 42);
        let w = sizes.words();
        let starts = [
            sc.index,
            sc.bitmap,
            sc.digits,
            sc.sorted,
            sc.counts,
            sc.offsets,
            sc.tile_sums,
        ];
        for (i, pair) in starts.windows(2).enumerate() {
            assert_eq!(pair[1] - pair[0], w[i] as u64 * 4);
        }
        assert_eq!(
            sc.pts.partials[1] - sc.pts.buckets,
            sizes.points()[..4].iter().sum::<usize>() as u64 * XYZZ
        );
    }

    #[test]
    fn msm_host_combine_is_horner() {
        use ark_std::UniformRand;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(26);
        for c in [4u32, 13, 16, 20] {
            let windows = WindowPlan::with_bits(c).windows as usize;
            let mut sums: Vec<G1Projective> =
                (0..windows).map(|_| G1Projective::rand(&mut rng)).collect();
            sums[0] = G1Projective::zero();
            sums[windows / 2] = sums[windows / 2 - 1];
            sums[windows - 1] = G1Projective::zero();
            let want: G1Projective = (sums.iter().enumerate())
                .map(|(w, p)| *p * Fr::from(2u64).pow([c as u64 * w as u64]))
                .sum();
            assert_eq!(combine_windows(&sums, c), want, "c {c}");
        }
        assert_eq!(
            combine_windows::<G1Projective>(&[], 16),
            G1Projective::zero()
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
