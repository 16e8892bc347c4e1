//! G1 multi-scalar multiplication on the device: Σ k_i·P_i over BLS12-381 G1.
//!
//! - [`msm`]: Pippenger with signed c-bit windows, for arbitrary scalars.
//! - [`batch_add`]: Σ P_i over a bitmap, for scalars equal to one.
//! - [`msm_split`]: the prover's split. The CPU prep classifies the scalars into zero /
//!   one / other ([`ScalarClasses`]); the device adds the ones' bases by
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
//! runs each alone for the tests (stage (c') one round at a time). The `*_enqueue`
//! functions only enqueue on the caller's stream and write a result record into a slot
//! of an [`MsmResults`]: an accumulator (the batch addition's sum, or zero) and the
//! window sums. [`read_points`] waits
//! (checked), converts, and combines the windows on the host (stage (e)). The plain
//! functions ([`msm`], [`batch_add`], [`msm_split`]) allocate a workspace, wait, and
//! free it before they return. Every driver call and launch returns
//! its error; a slot that holds no point of G1 is an error too.
//!
//! Layout, in pipeline order: [`plan`] (window widths, the signed digits' CPU model),
//! [`inputs`] (bases, scalars), `workspace` (scratch sizes and
//! regions, per-curve point regions, stage (c')'s options [`AffineRounds`]), `enqueue`
//! (stages (a)–(d), the batch-affine rounds (c') before (c), and the Pippenger run),
//! this module (result slots, stage (e) and the entry points), [`stages`] (each stage
//! alone, for its test) and [`bench`](mod@bench) (test data and `twolock bench msm`).

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use ark_bls12_381::{G1Affine, G1Projective};
use ark_ec::{AdditiveGroup, CurveGroup};
use ark_ff::{Field, UniformRand, Zero};
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
    pub const HALVE_COUNTS: &str = "msm_halve_counts";
    pub const PAIR_ENTRIES: &str = "msm_pair_entries";
    pub const PAIR_POINTS: &str = "msm_pair_points";
    pub const ACCUMULATE_POINTS: &str = "msm_accumulate_points";
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
/// Window widths an explicit plan may use: c ≤ 22 keeps a window's 2^21 buckets at
/// 384 MiB; c ≥ 4 bounds the window count at [`MAX_WINDOWS`].
pub const MIN_WINDOW_BITS: u32 = 4;
pub const MAX_WINDOW_BITS: u32 = 22;
/// The widest window [`WindowPlan::for_len`] picks below [`WIDE_WINDOW_MIN_LEN`].
/// Measured on an H200: moving from c = 16 (2^21 scalars, 42.7 ms accumulating) to
/// c = 18 (2^22, 163 ms) and c = 20 (2^24, 478 ms) made each bucket addition about 2×
/// slower; with the base prefetch in `accumulate_sorted` most of that is gone, but
/// c = 16 still beat c = 18 at 2^22 (79.7 against 88.2 ms). With two batch-affine
/// rounds at 2^24 c = 16 and c = 18 tie (128.5 and 129.1 ms) and c = 20 loses (147.2):
/// a bucket of ~32 entries leaves the rounds too little to pair (H100, session 24).
pub const MAX_PLANNED_WINDOW_BITS: u32 = 16;
/// From this many scalars the planner may pick up to [`WIDE_PLANNED_WINDOW_BITS`]: at
/// 2^26 a c = 20 bucket holds ~128 entries, and c = 20 with two rounds took 459 ms
/// against c = 16's 516 ms in the same run (H100, docs/benchmarks.md, session 24).
pub const WIDE_WINDOW_MIN_LEN: usize = 1 << 26;
pub const WIDE_PLANNED_WINDOW_BITS: u32 = 20;
pub const MAX_WINDOWS: usize = 64;
/// Most accumulation slices (threads of `accumulate_sorted`); a workspace uses as many
/// as are resident on its GPU, up to this.
const MAX_SLICES: usize = 1 << 17;
/// Heads folded per thread and level; points summed per thread in `sum_chunks`.
const FOLD: u32 = 32;
/// Scalar positions and base indices must fit 31 bits (bit 31 is the sign).
pub const MAX_LEN: usize = (1 << 31) - 1;
/// A sorted entry's base index (`msm::MAG`; bit 31 is the sign, `msm::NEG`).
pub(super) const ENTRY_INDEX: u32 = 0x7fff_ffff;
const XYZZ: u64 = std::mem::size_of::<DevG1Xyzz>() as u64;
const AFFINE: u64 = std::mem::size_of::<DevG1Affine>() as u64;

pub mod bench;
mod enqueue;
pub mod inputs;
pub mod plan;
pub mod stages;
mod workspace;

pub use bench::*;
use enqueue::*;
pub use inputs::*;
pub use plan::*;
use workspace::*;
pub use workspace::{AffineRounds, MsmWorkspace};
pub(crate) use workspace::{Beside, Curve, PointScratch};

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

/// Stage (e) on the host: `Σ_w 2^(cw)·sums[w]`, by Horner from the top window down.
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
    split: &ScalarClasses,
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
/// `beside`'s bases hold at least `split.len()` points and its point regions the
/// workspace's [`MsmWorkspace::point_counts`], its windows [`MAX_WINDOWS`] points, all
/// live until the stream has run the work.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn msm_split_beside_enqueue(
    gpu: &Gpu,
    stream: &Stream,
    ws: &mut MsmWorkspace,
    bases: BasesView<'_>,
    split: &ScalarClasses,
    out: &mut MsmResults,
    index: usize,
    beside: Option<Beside>,
) -> Result<Option<WindowPlan>, CudaError> {
    let ones = Bitmap {
        words: split.ones_words(),
        len: split.len(),
    };
    batch_add_enqueue(gpu, stream, ws, bases, ones, out, index)?;
    let rec = out.record(index)?;
    let n = split.other_indices().len();
    stage_scalars(gpu, stream, ws, ScalarsRef::Host(split.other_scalars()))?;
    let run = Run {
        bases: bases.ptr,
        n,
        base_index: ws.scratch.index,
        windows: rec + XYZZ,
        beside,
    };
    // SAFETY: the index region holds max_n ≥ n entries, each < split.len() ≤ bases.len
    // (and ≤ the second curve's bases, per the caller); the window sums follow the
    // accumulator in the record.
    let plan = unsafe {
        upload(gpu, stream, ws.scratch.index, split.other_indices())?;
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
    split: &ScalarClasses,
) -> Result<G1Projective, CudaError> {
    run_once(gpu, stream, split.len(), |ws, out| {
        msm_split_enqueue(gpu, stream, ws, bases, split, out, 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::Field;

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
}
