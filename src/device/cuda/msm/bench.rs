//! Test data (random bases and scalars) and `twolock bench msm`.

use super::*;

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
    /// Stage (c')'s options (None: off) and the rounds it ran at this size.
    pub affine: Option<AffineRounds>,
    pub affine_rounds: u32,
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
    bench_msm_with(
        gpu,
        log_sizes,
        runs,
        window_bits,
        Some(AffineRounds::DEFAULT),
    )
}

/// [`bench_msm_with_bits`] with stage (c') as `affine` says (None: off).
pub fn bench_msm_with(
    gpu: &Gpu,
    log_sizes: &[u32],
    runs: usize,
    window_bits: Option<u32>,
    affine: Option<AffineRounds>,
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
    let mut ws = MsmWorkspace::with_affine(gpu, &s, 1 << max_log, plan, affine, kind)?;
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
        let affine_rounds = affine.map_or(0, |a| a.for_plan(n, plan));
        timings.push(MsmTiming {
            log_n,
            plan,
            affine,
            affine_rounds,
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
pub(super) fn timed_read(
    gpu: &Gpu,
    s: &Stream,
    out: &MsmResults,
) -> Result<(G1Projective, f64), CudaError> {
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
pub(super) fn staged_run(
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

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ec::AffineRepr;

    #[test]
    fn msm_walk_bases_walks() {
        let v = walk_bases(40_000, 3);
        assert_eq!(v.len(), 40_000);
        let d = v[1].into_group() - v[0];
        assert!(v.windows(2).all(|w| w[1].into_group() - w[0] == d));
        assert!(v.iter().all(|p| p.is_on_curve()));
    }
}
