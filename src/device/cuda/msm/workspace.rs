//! Device scratch of the pipeline: sizes, the regions carved from three buffers, and the
//! per-curve point regions of the point stages.

use super::*;

// Workspace

/// Element counts of a workspace's scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(super) max_n: usize,
    /// Digits and sorted entries: windows per pass × max_n.
    pub(super) entries: usize,
    /// Buckets and counts (offsets: one more): windows per pass × buckets per window.
    pub(super) keys: usize,
    pub(super) slices: usize,
    /// Reduction groups / batch-addition parts, and the first fold of those.
    pub(super) partials: [usize; 2],
    /// Stage (c'), if on: its options with `entries` within [max_n, windows per pass ×
    /// max_n] (a sub-pass holds at least one window, at most a pass).
    pub(super) affine: Option<AffineRounds>,
}

/// Raw addresses of the scratch one Pippenger pass uses, carved from a workspace's
/// three buffers (scalars, u32 words, points).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Scratch {
    pub(super) scalars: CUdeviceptr,
    pub(super) index: CUdeviceptr,
    pub(super) bitmap: CUdeviceptr,
    pub(super) digits: CUdeviceptr,
    pub(super) sorted: CUdeviceptr,
    pub(super) counts: CUdeviceptr,
    pub(super) offsets: CUdeviceptr,
    pub(super) tile_sums: CUdeviceptr,
    pub(super) head_keys: [CUdeviceptr; 2],
    pub(super) pts: PointScratch,
    pub(super) slices: usize,
}

/// Stage (c') options: `rounds` batch-affine rounds before the XYZZ accumulation
/// (fewer when buckets are too small to pair: see [`AffineRounds::for_plan`]), over
/// sub-passes of at most `entries` sorted entries (the scratch grows ~100 B an entry),
/// each thread sharing one inversion among about `batch` pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AffineRounds {
    pub rounds: u32,
    pub entries: usize,
    pub batch: usize,
}

impl AffineRounds {
    /// What [`MsmWorkspace::new`] uses: two rounds, sub-passes of up to 2^26 entries.
    pub const DEFAULT: AffineRounds = AffineRounds {
        rounds: 2,
        entries: 1 << 26,
        batch: 256,
    };
    /// Rounds for an MSM of n scalars under `plan`: at most `rounds`, and none once a
    /// bucket holds fewer than two entries on average (n / 2^(c−1) for full scalars).
    pub fn for_plan(&self, n: usize, plan: WindowPlan) -> u32 {
        let per_bucket = n / plan.buckets();
        self.rounds.min(per_bucket.checked_ilog2().unwrap_or(0))
    }
}

/// The regions of stage (c'), carved from one point buffer and one u32 buffer: round
/// outputs ping-pong between `pts[0]` and `pts[1]` (and their offsets), `prefix` holds
/// a round's prefix products (field elements).
#[derive(Clone, Copy, Debug)]
pub(super) struct AffineScratch {
    pub(super) pts: [CUdeviceptr; 2],
    pub(super) prefix: CUdeviceptr,
    pub(super) offsets: [CUdeviceptr; 2],
    /// Most threads of a round (and prefix slack).
    pub(super) threads: usize,
    pub(super) config: AffineRounds,
}

/// Element counts of stage (c')'s regions for sub-passes of `entries` sorted entries
/// over at most `keys` buckets, `batch` slots a thread: (points ×2, prefix field
/// elements, threads).
fn affine_counts(entries: usize, keys: usize, batch: usize) -> ([usize; 2], usize, usize) {
    // Round r's output is at most in_r / 2 + keys / 2 (odd runs): round 0 ≤ E/2 + K
    // (pts[0], also rounds 2, 4, …), round 1 ≤ E/4 + 2K (pts[1], rounds 3, 5, …).
    let out0 = entries / 2 + keys;
    let threads = out0.div_ceil(batch);
    ([out0, entries / 4 + 2 * keys], out0 + threads, threads)
}

/// Affine points of stage (c')'s point buffer: both point regions, then the prefix
/// (a field element is half a point).
fn affine_buffer_len((pts, prefix, _): ([usize; 2], usize, usize)) -> usize {
    pts[0] + pts[1] + prefix.div_ceil(2)
}

/// The point regions of one Pippenger pass, in one curve's XYZZ points: the buckets,
/// two head buffers and two partial-sum buffers (see [`Sizes::points`]). A second
/// curve's run beside a G1 one ([`Beside`]) has its own, of the same counts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PointScratch {
    pub(super) buckets: CUdeviceptr,
    pub(super) head_pts: [CUdeviceptr; 2],
    pub(super) partials: [CUdeviceptr; 2],
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
pub(super) const G1_CURVE: Curve = Curve {
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
    fn new(
        plan: WindowPlan,
        max_n: usize,
        windows_per_pass: Option<u32>,
        slices: usize,
        affine: Option<AffineRounds>,
    ) -> Sizes {
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
            affine: affine.map(|a| AffineRounds {
                entries: a.entries.clamp(max_n, wg * max_n),
                batch: a.batch.max(1),
                ..a
            }),
        }
    }
    /// The upper bound the `*_needed` functions report: the planner's plan for len, the
    /// accumulation slices at their maximum.
    fn needed(len: usize, windows_per_pass: Option<u32>, affine: Option<AffineRounds>) -> Sizes {
        Sizes::new(
            WindowPlan::for_len(len),
            len,
            windows_per_pass,
            MAX_SLICES,
            affine,
        )
    }
    /// Stage (c')'s counts ([`affine_counts`]), if on.
    fn affine_counts(&self) -> Option<([usize; 2], usize, usize)> {
        (self.affine).map(|a| affine_counts(a.entries, self.keys, a.batch))
    }
    /// Stage (c')'s device bytes: its point buffer and two offset arrays.
    fn affine_bytes(&self) -> u64 {
        self.affine_counts().map_or(0, |counts| {
            affine_buffer_len(counts) as u64 * AFFINE + 8 * (self.keys as u64 + 1)
        })
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
        (self.max_n * std::mem::size_of::<DevFr>() + words * 4) as u64
            + points as u64 * XYZZ
            + self.affine_bytes()
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
    pub(super) sizes: Sizes,
    /// Every MSM on this workspace uses this plan (`None`: [`WindowPlan::for_len`]).
    pub(super) plan: Option<WindowPlan>,
    pub(super) scratch: Scratch,
    pub(super) scalars: DeviceBuffer<DevFr>,
    pub(super) words: DeviceBuffer<u32>,
    pub(super) points: DeviceBuffer<DevG1Xyzz>,
    /// Stage (c')'s regions and their buffers (points and prefix; offsets), if on.
    pub(super) affine: Option<(AffineScratch, DeviceBuffer<DevG1Affine>, DeviceBuffer<u32>)>,
}

impl MsmWorkspace {
    /// All windows in one pass with [`AffineRounds::DEFAULT`] (the fastest, largest
    /// footprint).
    pub fn new(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::with_affine(
            gpu,
            stream,
            max_len,
            None,
            Some(AffineRounds::DEFAULT),
            kind,
        )
    }
    /// All windows in one pass, stage (c') as `affine` says (`None`: off, every
    /// addition in XYZZ), the plan `plan` (`None`: the planner's choice per size).
    pub fn with_affine(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        plan: Option<WindowPlan>,
        affine: Option<AffineRounds>,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        if let Some(p) = plan {
            if WindowPlan::checked(p.c)? != p {
                return Err(invalid(format!(
                    "window plan {p:?} is not c-bit windows over 256 bits"
                )));
            }
        }
        Self::build(gpu, stream, max_len, plan, None, affine, kind)
    }
    /// All windows in one pass, every MSM with `plan` instead of the planner's choice
    /// (benchmarks and tests of other window widths), [`AffineRounds::DEFAULT`]. `plan`
    /// must be [`WindowPlan::checked`]'s plan for its c.
    pub fn with_plan(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        plan: WindowPlan,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let affine = Some(AffineRounds::DEFAULT);
        Self::with_affine(gpu, stream, max_len, Some(plan), affine, kind)
    }
    /// `windows_per_pass` windows of a `max_len` MSM at a time (`None`: all), which
    /// bounds the digit, sort and bucket scratch: the small-card footprint. Stage (c')
    /// is off (its scratch would undo the saving).
    pub fn with_windows_per_pass(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        windows_per_pass: Option<u32>,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::build(gpu, stream, max_len, None, windows_per_pass, None, kind)
    }
    fn build(
        gpu: &Gpu,
        stream: &Stream,
        max_len: usize,
        plan: Option<WindowPlan>,
        windows_per_pass: Option<u32>,
        affine: Option<AffineRounds>,
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
            affine,
        );
        let mut ws = Self::with_sizes(gpu, stream, sizes, kind)?;
        ws.plan = plan;
        Ok(ws)
    }
    pub(super) fn with_sizes(
        gpu: &Gpu,
        s: &Stream,
        sizes: Sizes,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        let scalars = gpu.alloc::<DevFr>(s, sizes.max_n, kind)?;
        let words = gpu.alloc::<u32>(s, sizes.words().iter().sum(), kind)?;
        let points = gpu.alloc::<DevG1Xyzz>(s, sizes.points().iter().sum(), kind)?;
        let scratch = sizes.carve(scalars.raw(), words.raw(), points.raw());
        let mut ws = MsmWorkspace {
            sizes,
            plan: None,
            scratch,
            scalars,
            words,
            points,
            affine: None,
        };
        if let (Some(config), Some(counts)) = (sizes.affine, sizes.affine_counts()) {
            let (pts, _, threads) = counts;
            // On an error, Drop frees what was allocated (the workspace included).
            let points = gpu.alloc::<DevG1Affine>(s, affine_buffer_len(counts), kind)?;
            let offsets = gpu.alloc::<u32>(s, 2 * (sizes.keys + 1), kind)?;
            let (pb, ob) = (points.raw(), offsets.raw());
            let scratch = AffineScratch {
                pts: [pb, pb + pts[0] as u64 * AFFINE],
                prefix: pb + (pts[0] + pts[1]) as u64 * AFFINE,
                offsets: [ob, ob + 4 * (sizes.keys as u64 + 1)],
                threads,
                config,
            };
            ws.affine = Some((scratch, points, offsets));
        }
        Ok(ws)
    }
    /// Device bytes of a workspace for `len` scalars, all windows in one pass (an upper
    /// bound: the accumulation slices are counted at their maximum).
    pub fn bytes_needed(len: usize) -> u64 {
        Sizes::needed(len, None, Some(AffineRounds::DEFAULT)).bytes()
    }
    /// [`MsmWorkspace::with_windows_per_pass`]'s bytes (stage (c') off).
    pub fn bytes_needed_with(len: usize, windows_per_pass: Option<u32>) -> u64 {
        Sizes::needed(len, windows_per_pass, None).bytes()
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
        Sizes::needed(len, windows_per_pass, None).points()
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
        gpu.poison(stream, &mut self.points)?;
        if let Some((_, points, offsets)) = &mut self.affine {
            gpu.poison(stream, points)?;
            gpu.poison(stream, offsets)?;
        }
        Ok(())
    }
    /// Frees every buffer now, reporting the first error (see [`DeviceBuffer::free`]).
    pub fn free(self) -> Result<(), CudaError> {
        let mut r = vec![self.scalars.free(), self.words.free(), self.points.free()];
        if let Some((_, points, offsets)) = self.affine {
            r.extend([points.free(), offsets.free()]);
        }
        r.into_iter().collect()
    }
    /// Windows per pass for an MSM of n > 0 scalars under `plan`.
    pub(super) fn windows_per_pass(&self, n: usize, plan: WindowPlan) -> Result<u32, CudaError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msm_workspace_layout() {
        assert!(MsmWorkspace::bytes_needed(1 << 16) < MsmWorkspace::bytes_needed(1 << 20));
        assert!(
            MsmWorkspace::bytes_needed_with(1 << 24, Some(2)) < MsmWorkspace::bytes_needed(1 << 24)
        );
        // An explicit plan sizes the buckets: keys = windows × 2^(c−1).
        let p18 = WindowPlan::with_bits(18);
        let sizes = Sizes::new(p18, 1 << 14, None, 500, None);
        assert_eq!(sizes.keys, p18.windows as usize * p18.buckets());
        assert_eq!(sizes.entries, p18.windows as usize * (1 << 14));
        // Regions are disjoint and in bounds: each starts where the previous ends.
        let sizes = Sizes::new(WindowPlan::for_len(1000), 1000, None, 500, None);
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
}
