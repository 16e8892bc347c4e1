//! Stage enqueuers (a)–(d) and the Pippenger run over them: each enqueues kernels only.

use super::*;

// Launch plumbing

pub(super) fn cfg_2d(n: usize, y: u32, block: u32) -> Result<LaunchConfig, CudaError> {
    let mut cfg = grid_1d(n, block)?;
    cfg.grid_dim.1 = y.max(1);
    Ok(cfg)
}

/// # Safety
/// `dst` must address `bytes` bytes of live device memory.
pub(super) unsafe fn zero(
    gpu: &Gpu,
    s: &Stream,
    dst: CUdeviceptr,
    bytes: usize,
) -> Result<(), CudaError> {
    gpu.context().bind_to_thread()?;
    // SAFETY: per the contract.
    unsafe { result::memset_d8_async(dst, 0, bytes, s.cu_stream()) }?;
    Ok(())
}

/// Stage markers of an instrumented run (bench only): (stage that just ended, event).
pub(super) type Clock = Vec<(&'static str, CudaEvent)>;

pub(super) fn mark(
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
pub(super) unsafe fn enqueue_from_montgomery(
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
pub(super) unsafe fn enqueue_digits(
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
/// entries; `sc.counts` ends as the cursor. `base_index` 0 is the identity map. An
/// instrumented run times its three steps apart (`clock`): the count, the scan and the
/// scatter.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn enqueue_sort(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    base_index: CUdeviceptr,
    n: usize,
    c: u32,
    wc: u32,
    clock: &mut Option<&mut Clock>,
) -> Result<(), CudaError> {
    let keys = wc as usize * (1usize << (c - 1));
    let n32 = u32_of(n)?;
    let Scratch {
        counts,
        offsets,
        digits,
        sorted,
        ..
    } = *sc;
    // SAFETY: `counts` holds `keys` u32.
    unsafe { zero(gpu, s, counts, keys * 4) }?;
    // msm_bucket_count(u32* counts, const u32* digits, u32 n, u32 c); grid.y = window
    launch!(gpu, s, kernel::BUCKET_COUNT, cfg_2d(n, wc, LIGHT_BLOCK)?; counts, digits, n32, c)?;
    mark(gpu, s, clock, "sort: count")?;
    // SAFETY: `offsets` holds keys + 1 u32; counts becomes the scatter's cursor.
    unsafe { enqueue_scan(gpu, s, sc, offsets, keys) }?;
    mark(gpu, s, clock, "sort: scan")?;
    // msm_bucket_scatter(u32* sorted, u32* cursor, const u32* digits, const u32* base_index,
    //                    u32 n, u32 c); grid.y = window
    launch!(gpu, s, kernel::BUCKET_SCATTER, cfg_2d(n, wc, LIGHT_BLOCK)?; sorted, counts, digits, base_index, n32, c)?;
    mark(gpu, s, clock, "sort: scatter")
}

/// offsets[0..=keys] = the exclusive prefix sums of `sc.counts[0..keys]`, which become
/// a copy of offsets[0..keys] (the scatter's cursor).
///
/// # Safety
/// `offsets` addresses keys + 1 u32; keys ≤ the workspace's.
unsafe fn enqueue_scan(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    offsets: CUdeviceptr,
    keys: usize,
) -> Result<(), CudaError> {
    let tiles = keys.div_ceil(SCAN_TILE);
    let (k32, t32, counts, tile_sums) = (u32_of(keys)?, u32_of(tiles)?, sc.counts, sc.tile_sums);
    let tile_grid = grid_1d(tiles * SCAN_THREADS as usize, SCAN_THREADS)?;
    // msm_scan_reduce(u32* tile_sums, const u32* counts, u32 K)
    launch!(gpu, s, kernel::SCAN_REDUCE, tile_grid; tile_sums, counts, k32)?;
    // msm_scan_tiles(u32* tile_sums, u32 tiles)
    launch!(gpu, s, kernel::SCAN_TILES, grid_1d(1, SCAN_THREADS)?; tile_sums, t32)?;
    // msm_scan_apply(u32* offsets, u32* cursor, const u32* counts, const u32* tile_sums, u32 K)
    launch!(gpu, s, kernel::SCAN_APPLY, tile_grid; offsets, counts, counts, tile_sums, k32)
}

/// (c) Bucket sums over `slices` (≤ sc.slices) slices of the sorted entries, then the
/// heads folded `fold` at a time, level by level.
/// The sorted entries, offsets and head keys come from `sc`; the points go to `pts`, in
/// `curve`'s points (a second curve rewrites the head keys with the same values).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn enqueue_accumulate(
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
    // SAFETY: forwarded.
    unsafe { enqueue_fold_heads(gpu, s, curve, sc, pts, buckets, slices, fold) }
}

/// Folds the heads of `slices` accumulation slices into `buckets`, `fold` at a time,
/// level by level.
///
/// # Safety
/// As [`enqueue_accumulate`]; `buckets` holds the keys the heads name.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_fold_heads(
    gpu: &Gpu,
    s: &Stream,
    curve: &Curve,
    sc: &Scratch,
    pts: &PointScratch,
    buckets: CUdeviceptr,
    slices: usize,
    fold: u32,
) -> Result<(), CudaError> {
    let (hk, hp, block) = (sc.head_keys, pts.head_pts, curve.block);
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

/// (c') then (c) for G1: for each sub-pass of the pass's wc windows (as many as
/// `aff.config.entries` sorted entries hold), `rounds` batch-affine rounds, then the XYZZ
/// accumulation of their points into the sub-pass's buckets.
///
/// # Safety
/// As [`enqueue_accumulate`]; the sort of wc windows of n scalars has run on `sc`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn enqueue_accumulate_affine(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    aff: &AffineScratch,
    bases: CUdeviceptr,
    (n, plan, wc, rounds): (usize, WindowPlan, u32, u32),
    clock: &mut Option<&mut Clock>,
) -> Result<(), CudaError> {
    let nb = plan.buckets();
    let sub = (aff.config.entries / n).clamp(1, wc as usize);
    for w0 in (0..wc as usize).step_by(sub) {
        let (keys, k0) = (sub.min(wc as usize - w0) * nb, w0 * nb);
        let entries = keys / nb * n;
        let k32 = u32_of(keys)?;
        // Round 0 reads the sort's offsets of these keys (absolute positions in sorted).
        let mut in_off = sc.offsets + 4 * k0 as u64;
        for r in 0..rounds as usize {
            let (out_off, out_pts) = (aff.offsets[r % 2], aff.pts[r % 2]);
            let src = match r {
                0 => PairSource::Entries(sc.sorted, bases),
                _ => PairSource::Points(aff.pts[(r - 1) % 2]),
            };
            // Threads for ~batch slots each at the round's most output.
            let most = (entries >> (r + 1)) + keys;
            let threads = most.div_ceil(aff.config.batch).clamp(1, aff.threads);
            // SAFETY: the regions hold a round's most output (`affine_counts`); the
            // offsets regions hold the workspace's keys + 1 ≥ keys + 1.
            let round = (in_off, out_off, out_pts);
            unsafe { enqueue_pair_round(gpu, s, sc, aff.prefix, round, src, keys, threads) }?;
            in_off = out_off;
        }
        mark(gpu, s, clock, "affine rounds")?;
        let pts = aff.pts[(rounds as usize - 1) % 2];
        let buckets = sc.pts.buckets + k0 as u64 * XYZZ;
        let slices = (entries >> rounds).div_ceil(4).clamp(1, sc.slices);
        let (hk0, hp0, s32) = (sc.head_keys[0], sc.pts.head_pts[0], u32_of(slices)?);
        // msm_accumulate_points(xyzz* buckets, u32* head_keys, xyzz* head_pts,
        //                       const u32* offsets, const affine* pts, u32 K, u32 S)
        launch!(gpu, s, kernel::ACCUMULATE_POINTS, grid_1d(slices, POINT_BLOCK)?; buckets, hk0, hp0, in_off, pts, k32, s32)?;
        // SAFETY: the heads name keys < `keys` of these buckets.
        unsafe { enqueue_fold_heads(gpu, s, &G1_CURVE, sc, &sc.pts, buckets, slices, FOLD) }?;
        mark(gpu, s, clock, "accumulate")?;
    }
    Ok(())
}

/// Where a batch-affine round reads its points: the sorted entries (base index | sign)
/// with the bases, or a previous round's affine points.
#[derive(Clone, Copy, Debug)]
pub(super) enum PairSource {
    Entries(CUdeviceptr, CUdeviceptr),
    Points(CUdeviceptr),
}

/// (c') One batch-affine round over `keys` buckets: in_off's run lengths halved (in
/// `sc.counts`), scanned into out_off, and each run's pairs summed into out_pts by
/// `threads` threads sharing one inversion each (prefix products in `prefix`).
///
/// # Safety
/// in_off and out_off address keys + 1 u32; `src` holds in_off[keys] points (entries
/// naming live bases); out_pts the round's output (≤ in/2 + keys/2 points); `prefix`
/// at least output + threads field elements; keys ≤ the workspace's.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn enqueue_pair_round(
    gpu: &Gpu,
    s: &Stream,
    sc: &Scratch,
    prefix: CUdeviceptr,
    (in_off, out_off, out_pts): (CUdeviceptr, CUdeviceptr, CUdeviceptr),
    src: PairSource,
    keys: usize,
    threads: usize,
) -> Result<(), CudaError> {
    let (k32, counts) = (u32_of(keys)?, sc.counts);
    // msm_halve_counts(u32* counts, const u32* in_off, u32 K)
    launch!(gpu, s, kernel::HALVE_COUNTS, grid_1d(keys, LIGHT_BLOCK)?; counts, in_off, k32)?;
    // SAFETY: per the contract.
    unsafe { enqueue_scan(gpu, s, sc, out_off, keys) }?;
    let (grid, t32) = (grid_1d(threads, POINT_BLOCK)?, u32_of(threads)?);
    match src {
        PairSource::Entries(sorted, bases) => {
            // msm_pair_entries(affine* out, fp* prefix, const u32* in_off, const u32* out_off,
            //                  const u32* sorted, const affine* bases, u32 K, u32 S)
            launch!(gpu, s, kernel::PAIR_ENTRIES, grid; out_pts, prefix, in_off, out_off, sorted, bases, k32, t32)
        }
        PairSource::Points(pts) => {
            // msm_pair_points(affine* out, fp* prefix, const u32* in_off, const u32* out_off,
            //                 const affine* pts, u32 K, u32 S)
            launch!(gpu, s, kernel::PAIR_POINTS, grid; out_pts, prefix, in_off, out_off, pts, k32, t32)
        }
    }
}

/// Buckets per reduction thread: about `slices` groups in all, a power of two ≤ NB.
pub(super) fn reduction_span(plan: WindowPlan, wc: u32, slices: usize) -> u32 {
    let want = (wc as usize * plan.buckets()).div_ceil(slices.max(1));
    want.next_power_of_two().min(plan.buckets()) as u32
}

/// (d) Window sums of wc windows into out[0..wc]: running sums per group of `span`
/// buckets into partials[0], then folded.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn enqueue_reduce(
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
pub(super) unsafe fn enqueue_fold(
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
pub(super) struct Run {
    pub(super) bases: CUdeviceptr,
    pub(super) n: usize,
    /// Base of scalar i: base_index[i] (0: i).
    pub(super) base_index: CUdeviceptr,
    /// Where the window sums go (the plan's W points).
    pub(super) windows: CUdeviceptr,
    /// A second curve's MSM on the same scalars, window group by window group.
    pub(super) beside: Option<Beside>,
}

/// Stages (a)–(d): the window sums of `run` into `run.windows`. Returns the plan they
/// were made with (None for n = 0: no windows, nothing enqueued).
pub(super) unsafe fn enqueue_pippenger(
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
            enqueue_sort(gpu, s, sc, base_index, n, plan.c, wc, &mut clock)?;
            let keys = wc as usize * plan.buckets();
            match ws
                .affine
                .as_ref()
                .map(|(a, ..)| (a, a.config.for_plan(n, plan)))
            {
                Some((aff, rounds)) if rounds > 0 => {
                    let pass = (n, plan, wc, rounds);
                    enqueue_accumulate_affine(gpu, s, sc, aff, bases, pass, &mut clock)?;
                }
                _ => {
                    enqueue_accumulate(gpu, s, &G1_CURVE, sc, &sc.pts, bases, keys, slices, FOLD)?;
                    mark(gpu, s, &mut clock, "accumulate")?;
                }
            }
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
pub(super) unsafe fn enqueue_batch_add(
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
