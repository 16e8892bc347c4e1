//! Each pipeline stage alone, host data in and out, through the pipeline's enqueuers on
//! a workspace sized for the call (the per-stage tests). The whole workspace is
//! poisoned (0xA5) first, so an output a kernel fails to write, or scratch a kernel
//! reads before anything wrote it, is caught.

use super::*;
use crate::device::cuda::layout::{g1_affine_from_dev, projective_to_xyzz, DevFq};

/// A poisoned workspace of the given sizes (max_n, entries, keys, slices).
fn workspace(
    gpu: &Gpu,
    s: &Stream,
    dims: (usize, usize, usize, usize),
) -> Result<MsmWorkspace, CudaError> {
    workspace_with(gpu, s, dims, None)
}

/// [`workspace`] with stage (c')'s scratch as `affine` sizes it (its `entries` as given).
fn workspace_with(
    gpu: &Gpu,
    s: &Stream,
    (n, e, k, sl): (usize, usize, usize, usize),
    affine: Option<AffineRounds>,
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
        affine,
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
fn put<T: cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    s: &Stream,
    dst: CUdeviceptr,
    host: &[T],
) -> Result<(), CudaError> {
    // SAFETY: callers pass a scratch region of at least host.len() values.
    unsafe { upload(gpu, s, dst, host) }
}

/// (a) Canonical limbs of each scalar.
pub fn from_montgomery(gpu: &Gpu, s: &Stream, scalars: &[Fr]) -> Result<Vec<[u64; 4]>, CudaError> {
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

/// (b) output: `offsets[0..=K]` and the sorted entries (`offsets[K]` of them).
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
    unsafe { enqueue_sort(gpu, s, &ws.scratch, idx, n, c, wc, &mut None) }?;
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
        .any(|e| (e & ENTRY_INDEX) as usize >= bases.len);
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

/// (c') One batch-affine round over the buckets of `offsets` (keys + 1 of them): its
/// input is `entries` (base index | sign) with the bases, or, given `points`, a previous
/// round's points laid out by `offsets`; `threads` threads. Returns the output offsets
/// (keys + 1) and points (each run's pairs summed in order, an odd one out copied).
pub fn pair_round(
    gpu: &Gpu,
    s: &Stream,
    bases: BasesView<'_>,
    offsets: &[u32],
    entries: &[u32],
    points: Option<&[G1Affine]>,
    threads: usize,
) -> Result<(Vec<u32>, Vec<G1Affine>), CudaError> {
    let keys = offsets.len().saturating_sub(1);
    let total = offsets.last().map_or(0, |&t| t as usize);
    let from_entries = points.is_none();
    let bad = keys == 0
        || threads == 0
        || offsets.windows(2).any(|w| w[0] > w[1])
        || points.map_or(entries.len(), <[_]>::len) != total
        || (from_entries
            && entries
                .iter()
                .any(|e| (e & ENTRY_INDEX) as usize >= bases.len));
    if bad {
        return Err(invalid(
            "pair_round: offsets, threads, input count or an index",
        ));
    }
    // Batch 1 sizes the most threads (and prefix slack) at the most output; entries of
    // 2·total leave pts[0] room for the input points and pts[1] for the output.
    let affine = AffineRounds {
        rounds: 1,
        entries: 2 * total.max(1),
        batch: 1,
    };
    let ws = workspace_with(gpu, s, (0, total.max(1), keys, 1), Some(affine))?;
    let aff = ws
        .affine
        .as_ref()
        .map(|(a, ..)| *a)
        .ok_or_else(|| invalid("no stage (c') scratch"))?;
    put(gpu, s, ws.scratch.offsets, offsets)?;
    let src = match points {
        None => {
            put(gpu, s, ws.scratch.sorted, entries)?;
            PairSource::Entries(ws.scratch.sorted, bases.ptr)
        }
        Some(p) => {
            put(gpu, s, aff.pts[0], &g1_affines_to_dev(p))?;
            PairSource::Points(aff.pts[0])
        }
    };
    let round = (ws.scratch.offsets, aff.offsets[0], aff.pts[1]);
    let threads = threads.min(aff.threads);
    // SAFETY: `affine_counts` sized the regions for 2·total entries over `keys` buckets
    // at batch 1 (threads ≤ its most); the input is in pts[0] or the sorted region.
    unsafe { enqueue_pair_round(gpu, s, &ws.scratch, aff.prefix, round, src, keys, threads) }?;
    let out_off: Vec<u32> = get(gpu, s, aff.offsets[0], keys + 1)?;
    let out: Vec<DevG1Affine> = get(gpu, s, aff.pts[1], out_off[keys] as usize)?;
    let out = (out.iter().enumerate())
        .map(|(i, d)| {
            g1_affine_from_dev(d)
                .ok_or_else(|| invalid(format!("pair_round: output {i} is not a point")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    ws.free()?;
    Ok((out_off, out))
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
