//! B_G2 on the device: Σ b_i·P_i over BLS12-381 G2 bases, computed beside B_G1 (same
//! scalars). Its ones are a batch addition over B_G1's bitmap; its others a Pippenger
//! that reuses B_G1's digits and sorted entries and runs only the point stages again,
//! over G2 ([`G2Scratch::enqueue_with_g1`]).
//!
//! The kernels are msm.cuh's over `fp2_t` (`cuda/g2.cu`, the field in `cuda/fp2.cuh`).
//! [`G2Scratch::enqueue`] gives each of up to
//! as many threads as the GPU holds resident a run of bitmap words and a partial sum, then
//! folds the partials [`FOLD`] at a time on the device until at most [`CPU_PARTIALS`]
//! remain; [`G2Scratch::read_sum`] downloads those, checks each, and sums them on the
//! CPU. The plain [`batch_add_g2`] does all of it with its own scratch.
//!
//! Bases are affine and resident ([`DeviceG2Bases`], uploaded once per key and device).
//! Every driver call and launch returns its error; a partial that holds no point of the
//! curve, or a sum outside G2, is an error too.

use std::sync::Arc;

use ark_bls12_381::{G2Affine, G2Projective};
use ark_ec::CurveGroup;
use ark_ff::Zero;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, PushKernelArg};

use super::context::{download, grid_1d, invalid, launch, u32_of, upload};
use super::context::{AllocKind, CudaError, DeviceBuffer, Gpu};
use super::layout::{g2_affines_to_dev, g2_xyzz_to_projective, DevFq, DevG2Affine, DevG2Xyzz};
use super::msm::{self, BasesView, Beside, Bitmap, Curve, MsmResults, MsmWorkspace, PointScratch};
use super::msm::{WindowPlan, MAX_WINDOWS};
use crate::device::ScalarClasses;

type Stream = Arc<CudaStream>;

/// The module built from `cuda/g2.cu`.
pub const MODULE: &str = "g2";
/// Kernel names in [`MODULE`].
pub mod kernel {
    pub const BATCH_ADD_BITMAP: &str = "g2_batch_add_bitmap";
    pub const SUM_CHUNKS: &str = "g2_sum_chunks";
    pub const ACCUMULATE_SORTED: &str = "g2_accumulate_sorted";
    pub const ACCUMULATE_HEADS: &str = "g2_accumulate_heads";
    pub const REDUCE_BUCKETS: &str = "g2_reduce_buckets";
}

/// Block size of g2.cu (`G2_BLOCK`).
const BLOCK: u32 = 64;
/// Most partial sums (threads of the first kernel); a scratch uses as many as are
/// resident on its GPU, up to this (an H200 holds 132 SMs × 256 = 33,792).
const MAX_PARTS: usize = 1 << 16;
/// Partials summed per thread and level of the device fold: small, because each level's
/// time is FOLD − 1 dependent additions and fewer threads run each level.
pub const FOLD: usize = 8;
/// The fold stops once at most this many partials remain; the CPU sums those.
pub const CPU_PARTIALS: usize = 64;
/// Bit positions are u32 on the device.
pub const MAX_LEN: usize = u32::MAX as usize;
const XYZZ: u64 = std::mem::size_of::<DevG2Xyzz>() as u64;

/// G2's Pippenger point stages (`cuda/g2.cu`).
const G2_CURVE: Curve = Curve {
    module: MODULE,
    accumulate_sorted: kernel::ACCUMULATE_SORTED,
    accumulate_heads: kernel::ACCUMULATE_HEADS,
    reduce_buckets: kernel::REDUCE_BUCKETS,
    sum_chunks: kernel::SUM_CHUNKS,
    block: BLOCK,
    xyzz: XYZZ,
};

/// Affine G2 bases resident on one device (`b_g2_query[1..]` in the pipeline;
/// `g2_affine_t`, infinity as all zero).
#[derive(Debug)]
pub struct DeviceG2Bases {
    buf: DeviceBuffer<DevG2Affine>,
}

impl DeviceG2Bases {
    /// Uploads `points` and waits until the copy has landed (the host side is
    /// pageable: a kernel on another stream must not race the copy).
    pub fn upload(
        gpu: &Gpu,
        stream: &Stream,
        points: &[G2Affine],
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let host = g2_affines_to_dev(points);
        let buf = gpu.alloc::<DevG2Affine>(stream, host.len(), kind)?;
        // SAFETY: `buf` holds host.len() points.
        unsafe { upload(gpu, stream, buf.raw(), &host) }?;
        gpu.sync(stream, "g2 bases upload")?;
        Ok(DeviceG2Bases { buf })
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn bytes(&self) -> u64 {
        (self.len() * std::mem::size_of::<DevG2Affine>()) as u64
    }
    /// Frees now (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        self.buf.free()
    }
}

/// Partial sums of a scratch for up to max_n bases with at most `limit` first-level
/// threads: one per bitmap word at most, at least one.
fn parts_for(max_n: usize, limit: usize) -> usize {
    max_n.div_ceil(32).clamp(1, limit.max(1))
}

/// Points of a scratch with `parts` first-level partials: those, then room for the
/// first fold (each later level fits in the first region again).
fn points_for(parts: usize) -> usize {
    parts + parts.div_ceil(FOLD)
}

/// Device scratch for one G2 batch addition of up to max_n bases: the per-thread
/// partial sums and the folded ones. One batch addition at a time: [`G2Scratch::enqueue`]
/// takes it `&mut`, and each use is ordered after the previous one on the same stream
/// (the stream it was allocated on, where a stream-ordered free also waits for it).
#[derive(Debug)]
pub struct G2Scratch {
    max_n: usize,
    /// First-level threads at most (the GPU's resident count, ≤ [`MAX_PARTS`]).
    parts: usize,
    /// Two regions: [0, parts) and [parts, parts + ⌈parts/FOLD⌉), ping-ponged by the fold.
    points: DeviceBuffer<DevG2Xyzz>,
    /// Where the last enqueued batch addition leaves its partials: (address, count).
    /// `None` before the first enqueue and after a failed one.
    result: Option<(CUdeviceptr, usize)>,
    /// Room for the others' Pippenger beside a G1 one (scratches made with
    /// [`G2Scratch::alloc_beside`]).
    others: Option<Others>,
}

/// The others' point regions (as many points as the G1 workspace's) and their window
/// sums, and what the last enqueue left there.
#[derive(Debug)]
struct Others {
    /// The regions of `counts`, then [`MAX_WINDOWS`] window sums.
    points: DeviceBuffer<DevG2Xyzz>,
    counts: [usize; 5],
    /// After [`G2Scratch::enqueue_with_g1`]: the others' window plan (`Some(None)`:
    /// there were no others). `None` before, after a poison and after a failure.
    ran: Option<Option<WindowPlan>>,
}

impl Others {
    fn points_for(counts: [usize; 5]) -> usize {
        counts.iter().sum::<usize>() + MAX_WINDOWS
    }
    fn windows(&self) -> CUdeviceptr {
        self.points.raw() + (self.points.len() - MAX_WINDOWS) as u64 * XYZZ
    }
}

impl G2Scratch {
    /// Device bytes of a scratch for `max_n` bases (an upper bound: the partials are
    /// counted at their maximum, `MAX_PARTS`).
    pub fn bytes_needed(max_n: usize) -> u64 {
        points_for(parts_for(max_n, MAX_PARTS)) as u64 * XYZZ
    }
    /// A scratch with as many partials as threads of `g2_batch_add_bitmap` fit resident
    /// on `gpu` (full occupancy in one wave), fewer for a small max_n.
    pub fn alloc(
        gpu: &Gpu,
        stream: &Stream,
        max_n: usize,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        if max_n > MAX_LEN {
            return Err(invalid(format!(
                "G2 batch addition of {max_n} exceeds {MAX_LEN}"
            )));
        }
        let f = gpu.function(MODULE, kernel::BATCH_ADD_BITMAP)?;
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)?;
        let resident = (gpu.sm_count()? * per_sm.max(1) * BLOCK) as usize;
        let parts = parts_for(max_n, resident.min(MAX_PARTS));
        let points = gpu.alloc::<DevG2Xyzz>(stream, points_for(parts), kind)?;
        Ok(G2Scratch {
            max_n,
            parts,
            points,
            result: None,
            others: None,
        })
    }
    /// Device bytes of [`G2Scratch::alloc_beside`] for `max_n` bases beside a G1
    /// workspace that [`MsmWorkspace::bytes_needed_with`]`(ws_len, windows_per_pass)`
    /// sizes (an upper bound, as both are).
    pub fn bytes_needed_beside(max_n: usize, ws_len: usize, windows_per_pass: Option<u32>) -> u64 {
        let counts = MsmWorkspace::point_counts_needed(ws_len, windows_per_pass);
        Self::bytes_needed(max_n) + Others::points_for(counts) as u64 * XYZZ
    }
    /// A scratch that also holds B_G2's others beside the G1 workspace `ws`: the same
    /// point regions in G2 points, and the window sums.
    pub fn alloc_beside(
        gpu: &Gpu,
        stream: &Stream,
        max_n: usize,
        ws: &MsmWorkspace,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let mut scratch = Self::alloc(gpu, stream, max_n, kind)?;
        let counts = ws.point_counts();
        match gpu.alloc::<DevG2Xyzz>(stream, Others::points_for(counts), kind) {
            Ok(points) => {
                scratch.others = Some(Others {
                    points,
                    counts,
                    ran: None,
                });
                Ok(scratch)
            }
            Err(e) => {
                scratch.free()?;
                Err(e)
            }
        }
    }
    pub fn bytes(&self) -> u64 {
        let others = self.others.as_ref().map_or(0, |o| o.points.len());
        (self.points.len() + others) as u64 * XYZZ
    }
    pub fn max_len(&self) -> usize {
        self.max_n
    }
    /// Fills the scratch with 0xA5 bytes (tests: nothing may read what no kernel wrote;
    /// a [`G2Scratch::read_sum`] of poison is an error).
    pub fn poison(&mut self, gpu: &Gpu, stream: &Stream) -> Result<(), CudaError> {
        if let Some(o) = &mut self.others {
            o.ran = None;
            gpu.poison(stream, &mut o.points)?;
        }
        gpu.poison(stream, &mut self.points)
    }
    /// Frees now (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        let others = self.others.map_or(Ok(()), |o| o.points.free());
        self.points.free().and(others)
    }

    /// Enqueues B_G1's split MSM of `split` into `out[index]` and, beside it, B_G2 on
    /// the same scalars: its ones (batch addition on B_G1's bitmap) and, in a scratch
    /// made with [`G2Scratch::alloc_beside`] for `ws`, its others (Pippenger on B_G1's
    /// sorted entries). Read them with [`G2Scratch::read_sum`] and
    /// [`G2Scratch::read_others`]. Fewer G2 bases than scalars is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_with_g1(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        ws: &mut MsmWorkspace,
        g1_bases: BasesView<'_>,
        g2_bases: &DeviceG2Bases,
        split: &ScalarClasses,
        out: &mut MsmResults,
        index: usize,
    ) -> Result<(), CudaError> {
        if split.len() > g2_bases.len() {
            return Err(invalid(format!(
                "B_G2 of {} scalars: {} G2 bases",
                split.len(),
                g2_bases.len()
            )));
        }
        let beside = match &mut self.others {
            Some(o) if o.counts == ws.point_counts() => {
                o.ran = None;
                Some(Beside {
                    curve: G2_CURVE,
                    bases: g2_bases.buf.raw(),
                    pts: PointScratch::carve(o.points.raw(), o.counts, XYZZ),
                    windows: o.windows(),
                })
            }
            Some(_) => return Err(invalid("G2 scratch sized for another MSM workspace")),
            None => None,
        };
        // SAFETY: `beside`'s regions hold the workspace's point counts (checked above)
        // and MAX_WINDOWS window sums; its bases ≥ split.len() points; both live in
        // `self` and the key, which the caller keeps until the stream has run.
        let plan = unsafe {
            msm::msm_split_beside_enqueue(gpu, stream, ws, g1_bases, split, out, index, beside)
        }?;
        // SAFETY: the split just uploaded the ones' bitmap (⌈len/32⌉ words) into the
        // workspace, which nothing rewrites before the next split, ordered after this
        // kernel on the same stream.
        unsafe { self.enqueue(gpu, stream, g2_bases, ws.ones_bitmap(), split.len()) }?;
        if let Some(o) = &mut self.others {
            o.ran = Some(plan);
        }
        Ok(())
    }

    /// After [`G2Scratch::enqueue_with_g1`] in a scratch with room for them: the others'
    /// sum (window sums downloaded, checked to be points, combined on the host), which
    /// must lie in G2. `None` when the scratch has no such room.
    pub fn read_others(
        &self,
        gpu: &Gpu,
        stream: &Stream,
    ) -> Result<Option<G2Projective>, CudaError> {
        let Some(o) = &self.others else {
            return Ok(None);
        };
        let Some(plan) = o.ran else {
            return Err(invalid("G2 read_others before the others were enqueued"));
        };
        let Some(plan) = plan else {
            return Ok(Some(G2Projective::zero()));
        };
        let mut host = vec![DevG2Xyzz::default(); plan.windows as usize];
        // SAFETY: the windows region holds MAX_WINDOWS ≥ plan.windows points.
        unsafe { download(gpu, stream, o.windows(), &mut host) }?;
        let sums = (host.iter().enumerate())
            .map(|(i, d)| to_point(d, i))
            .collect::<Result<Vec<_>, _>>()?;
        let sum = msm::combine_windows(&sums, plan.c);
        in_g2(sum, "B_G2's others").map(Some)
    }

    /// Enqueues Σ `bases[i]` over the set bits i < n of the device bitmap at `bitmap`
    /// (⌈n/32⌉ u32 words, bit i = bit i % 32 of word i / 32; bits past n are ignored) on
    /// `stream`; the result stays in the scratch until [`G2Scratch::read_sum`]. n = 0
    /// enqueues nothing and sums to zero. n > bases.len() or n > max_n is an error.
    ///
    /// # Safety
    /// `bitmap` is a live device allocation of at least ⌈n/32⌉ words, written on (or
    /// ordered before) `stream`, and not written or freed before this work completes.
    /// `bases` (borrowed only for the call) must stay allocated until then too.
    pub unsafe fn enqueue(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        bases: &DeviceG2Bases,
        bitmap: CUdeviceptr,
        n: usize,
    ) -> Result<(), CudaError> {
        self.result = None;
        if n > bases.len() || n > self.max_n {
            return Err(invalid(format!(
                "G2 batch addition of {n}: {} bases, scratch for {}",
                bases.len(),
                self.max_n
            )));
        }
        let regions = [
            self.points.raw(),
            self.points.raw() + self.parts as u64 * XYZZ,
        ];
        if n == 0 {
            self.result = Some((regions[0], 0));
            return Ok(());
        }
        // Words per thread: ⌈words / parts⌉, so parts ≤ self.parts threads cover them.
        let words = n.div_ceil(32);
        let per = words.div_ceil(self.parts);
        let parts = words.div_ceil(per);
        let (p0, base_ptr, n32, per32) = (regions[0], bases.buf.raw(), u32_of(n)?, u32_of(per)?);
        // g2_batch_add_bitmap(xyzz* out, const affine* bases, const u32* bitmap, u32 n, u32 words)
        launch!(gpu, stream, kernel::BATCH_ADD_BITMAP, grid_1d(parts, BLOCK)?; p0, base_ptr, bitmap, n32, per32)?;
        // Fold region i into region 1 − i: the first level's ⌈parts/FOLD⌉ outputs fit
        // region 1 by its size, each later level's fit region 0 (≥ parts).
        let (mut len, mut i) = (parts, 0);
        while len > CPU_PARTIALS {
            let out_len = len.div_ceil(FOLD);
            let (dst, src, l32, chunk) = (regions[1 - i], regions[i], u32_of(len)?, FOLD as u32);
            // g2_sum_chunks(xyzz* out, const xyzz* in, u32 len, u32 chunk)
            launch!(gpu, stream, kernel::SUM_CHUNKS, grid_1d(out_len, BLOCK)?; dst, src, l32, chunk)?;
            (len, i) = (out_len, 1 - i);
        }
        self.result = Some((regions[i], len));
        Ok(())
    }

    /// After the caller synchronized `stream` (this waits for it again, checked):
    /// downloads the folded partial sums of the last [`G2Scratch::enqueue`], checks each
    /// is a point of the curve, sums them on the CPU, and checks the sum lies in G2.
    /// Before any (successful) enqueue, or when a partial holds no point, it is an error.
    pub fn read_sum(&self, gpu: &Gpu, stream: &Stream) -> Result<G2Projective, CudaError> {
        let Some((ptr, len)) = self.result else {
            return Err(invalid("G2 read_sum before a batch addition was enqueued"));
        };
        let mut host = vec![DevG2Xyzz::default(); len];
        // SAFETY: `enqueue` left `len` partials at `ptr`, inside `self.points`; every
        // bit pattern is a valid DevG2Xyzz.
        unsafe { download(gpu, stream, ptr, &mut host) }?;
        let parts = host
            .iter()
            .enumerate()
            .map(|(i, d)| to_point(d, i))
            .collect::<Result<Vec<_>, _>>()?;
        in_g2(parts.iter().sum(), "the G2 batch sum")
    }
}

/// `sum` if it is zero or a point of G2 (on the curve, in the subgroup).
fn in_g2(sum: G2Projective, what: &str) -> Result<G2Projective, CudaError> {
    let a = sum.into_affine();
    if sum.is_zero() || (a.is_on_curve() && a.is_in_correct_subgroup_assuming_on_curve()) {
        Ok(sum)
    } else {
        Err(invalid(format!("device {what} is not in G2: {a:?}")))
    }
}

/// A device partial as a point: reduced coordinates, ZZZ ≠ 0 unless ZZ = 0, on the curve.
fn to_point(d: &DevG2Xyzz, i: usize) -> Result<G2Projective, CudaError> {
    let zero = |f: &DevFq| f.0 == [0; 6];
    let zzz_zero = zero(&d.zzz.c0) && zero(&d.zzz.c1);
    let zz_zero = zero(&d.zz.c0) && zero(&d.zz.c1);
    (g2_xyzz_to_projective(d))
        .filter(|p| (zz_zero || !zzz_zero) && p.into_affine().is_on_curve())
        .ok_or_else(|| invalid(format!("device G2 partial {i} is not a point: {d:?}")))
}

/// Σ bases_i over the set bits of `ones` (standalone: tests, benches). Uploads the
/// bitmap, runs on a scratch of its own, waits, and frees the temporaries (waiting for
/// the frees). `ones.len` > bases or a bitmap shorter than ⌈len/32⌉ words is an error.
pub fn batch_add_g2(
    gpu: &Gpu,
    stream: &Stream,
    bases: &DeviceG2Bases,
    ones: Bitmap<'_>,
) -> Result<G2Projective, CudaError> {
    let len = ones.len;
    let words = ones.words.get(..len.div_ceil(32));
    let Some(words) = words.filter(|_| len <= bases.len()) else {
        let msg = format!(
            "G2 batch add of {len}: {} bases, {} words",
            bases.len(),
            ones.words.len()
        );
        return Err(invalid(msg));
    };
    let kind = AllocKind::StreamOrdered;
    // On an error below, whatever was allocated is freed on drop (an error there is
    // recorded in the context and reported by the next sync).
    let mut scratch = G2Scratch::alloc(gpu, stream, len, kind)?;
    let bitmap = gpu.alloc::<u32>(stream, words.len(), kind)?;
    // SAFETY: `bitmap` holds words.len() = ⌈len/32⌉ words, uploaded on `stream` before
    // the kernels, and freed below only after the sync that ends them.
    let run = unsafe {
        upload(gpu, stream, bitmap.raw(), words)
            .and_then(|()| scratch.enqueue(gpu, stream, bases, bitmap.raw(), len))
    }
    .and_then(|()| gpu.sync(stream, "g2 batch add"))
    .and_then(|()| scratch.read_sum(gpu, stream));
    let freed = scratch
        .free()
        .and(bitmap.free())
        .and_then(|()| gpu.sync(stream, "g2 scratch free"));
    let sum = run?;
    freed.map(|()| sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g2_scratch_sizes() {
        assert_eq!(parts_for(0, 1000), 1);
        assert_eq!(parts_for(33, 1000), 2);
        assert_eq!(parts_for(1 << 22, 33_792), 33_792);
        assert_eq!(points_for(33_792), 33_792 + 4_224);
        assert!(G2Scratch::bytes_needed(1 << 10) < G2Scratch::bytes_needed(1 << 22));
        assert_eq!(
            G2Scratch::bytes_needed(1 << 30),
            points_for(MAX_PARTS) as u64 * 384
        );
        // Every fold level fits the region it writes, for any first-level count.
        for parts in [1usize, 64, 65, 100, 513, 4096, 33_792, MAX_PARTS] {
            let (mut len, mut i) = (parts, 0);
            while len > CPU_PARTIALS {
                let out = len.div_ceil(FOLD);
                let room = if i == 0 { parts.div_ceil(FOLD) } else { parts };
                assert!(out <= room, "parts {parts}, level output {out}");
                (len, i) = (out, 1 - i);
            }
        }
    }
}
