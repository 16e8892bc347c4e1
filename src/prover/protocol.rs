//! The lock protocol for one partition: what reviewers read to judge a lock design and
//! what the loom models check. Phases (DESIGN.md): prep (CPU, no device lock; one prep
//! at a time) → pre-stage (mem) → compute (compute) → finish (CPU, no lock).

use super::flaws::{flawed, Flaw};
use super::timeline::{timed, Phase};
use super::{prep, LockMode, ProveError, Worker};
use crate::audit::LockKind;
use crate::device::{AllocSite, Device, DeviceBG2, Footprint, G1Results, PartitionInputs, Stage};
use crate::reference::{self, MsmResults};
use crate::Proof;

/// Proves partition `i` on worker `w`. `spare` carries the worker's host buffers from
/// one partition to its next (CPU memory only; no lock covers it).
pub(super) fn prove_partition<D: Device>(
    w: &Worker<D>,
    i: usize,
    spare: &mut Option<PartitionInputs>,
) -> Result<Proof, ProveError> {
    let batch = &w.shared.batch;
    let t = &w.shared.timeline;
    if !w.shared.cfg.sim_cpu_prep.is_zero() {
        // The sim's extra CPU time, modelled as work that overlaps (outside the gate).
        timed(t, i, w.who, Phase::Prep, || {
            crate::sync::sleep(w.shared.cfg.sim_cpu_prep)
        });
    }
    // Preps take turns, each spread over the rayon pool: the first partition is then ready
    // after one prep instead of W interleaved ones, which shortens the batch's ramp
    // before the GPU starts. A CPU-only gate: no device lock is taken while it is held.
    let start = t.now_us();
    let gate = w.shared.prep_gate.lock();
    t.record(i, w.who, Phase::PrepWait, start);
    let inputs = timed(t, i, w.who, Phase::Prep, || {
        prep::prepare_reusing(&batch.matrices, &batch.partitions[i], spare)
    });
    drop(gate);
    let inputs = inputs?;
    let proof = prove_prepared(w, i, &inputs);
    // The buffers go on to the worker's next partition even when this one failed.
    *spare = Some(inputs);
    proof
}

/// The device's part under the locks, then B_G2 and the assembly on the CPU.
fn prove_prepared<D: Device>(
    w: &Worker<D>,
    i: usize,
    inputs: &PartitionInputs,
) -> Result<Proof, ProveError> {
    let (batch, t) = (&w.shared.batch, &w.shared.timeline);
    let g1 = match w.shared.cfg.mode {
        LockMode::Two => two_lock(w, i, inputs)?,
        LockMode::Single => single_lock(w, i, inputs)?,
    };
    let b_g2 = timed(t, i, w.who, Phase::BG2, || {
        use crate::device::split::{msm_others, msm_split};
        type G2 = ark_bls12_381::G2Projective;
        let bases = batch.pk.b_g2_query.get(1..).unwrap_or(&[]);
        match g1.b_g2 {
            DeviceBG2::Whole(b_g2) => b_g2,
            // The device summed the ones under compute; the others are left.
            DeviceBG2::Ones(ones) => ones + msm_others::<G2>(bases, &inputs.classes),
            DeviceBG2::None => msm_split::<G2>(bases, &inputs.classes),
        }
    });
    let (r, s) = batch.rs[i];
    let msm = MsmResults {
        h: g1.h,
        l: g1.l,
        a: g1.a,
        b_g1: g1.b_g1,
        b_g2,
    };
    Ok(timed(t, i, w.who, Phase::Assemble, || {
        reference::assemble(&batch.pk, &msm, r, s)
    }))
}

/// Pre-stage under mem, then compute under compute, handing mem over only once compute
/// is ours: exactly one working set is staged ahead of the running one, and a worker
/// whose pre-stage did not fit allocates before anyone else may pre-stage.
fn two_lock<D: Device>(
    w: &Worker<D>,
    i: usize,
    inputs: &PartitionInputs,
) -> Result<G1Results, ProveError> {
    let (dev, stream) = (&*w.dev.device, &w.stream);
    let mem = w.lock(i, LockKind::Mem, None)?;

    // Under mem only calls that never wait on other streams: alloc and an async upload.
    // No free (cudaFree synchronizes the device), no device synchronize, no pool trim.
    if flawed(w, Flaw::GlobalSyncUnderMem) {
        dev.sync_device(stream)?;
        dev.trim_pool(stream)?;
    }
    let alloc = if flawed(w, Flaw::IgnoreFreeMemory) {
        dev.flawed_alloc_unchecked(stream, &w.dev.shape)
    } else {
        dev.alloc(stream, &w.dev.shape, Footprint::Full, AllocSite::PreStage)
    };
    let staged = match alloc {
        Ok(mut ws) => {
            let up = timed(&w.shared.timeline, i, w.who, Phase::Upload, || {
                dev.upload(stream, &mut ws, inputs)
            });
            Some((ws, up))
        }
        Err(e) if e.is_oom() => None,
        Err(e) => return Err(e.into()),
    };
    let mut mem = Some(mem);
    if staged.is_none() && flawed(w, Flaw::OppositeLockOrder) {
        mem = None; // re-taken under compute below: compute → mem against mem → compute
    }

    let outstanding = || dev.outstanding_bytes(stream);
    let compute = match w.lock(i, LockKind::Compute, Some(&outstanding)) {
        Ok(c) => c,
        Err(e) => {
            // Release mem before freeing: a free may synchronize the device.
            drop(mem);
            if let Some((ws, _)) = staged {
                dev.free(stream, ws)?;
            }
            return Err(e);
        }
    };
    let (ws, uploaded) = match staged {
        Some(staged) => {
            drop(mem);
            staged
        }
        None => {
            // Fallback. The previous holder's set was truly free when it released compute
            // (audited), and nobody pre-staged since: we still hold mem.
            if mem.is_none() {
                mem = Some(w.lock(i, LockKind::Mem, None)?);
            }
            w.shared.count_fallback();
            let start = w.shared.timeline.now_us();
            let ws = fallback_alloc(dev, stream, &w.dev.shape);
            w.shared.timeline.record(i, w.who, Phase::Fallback, start);
            let mut ws = ws?;
            let up = dev.upload(stream, &mut ws, inputs);
            drop(mem);
            (ws, up)
        }
    };
    run_and_free(w, i, compute, ws, uploaded)
}

/// The baseline: one lock around allocation, upload and compute.
fn single_lock<D: Device>(
    w: &Worker<D>,
    i: usize,
    inputs: &PartitionInputs,
) -> Result<G1Results, ProveError> {
    let (dev, stream) = (&*w.dev.device, &w.stream);
    let outstanding = || dev.outstanding_bytes(stream);
    let gpu = w.lock(i, LockKind::Compute, Some(&outstanding))?;
    let mut ws = match dev.alloc(stream, &w.dev.shape, Footprint::Full, AllocSite::PreStage) {
        Err(e) if e.is_oom() => fallback_alloc(dev, stream, &w.dev.shape)?,
        other => other?,
    };
    let up = timed(&w.shared.timeline, i, w.who, Phase::Upload, || {
        dev.upload(stream, &mut ws, inputs)
    });
    run_and_free(w, i, gpu, ws, up)
}

/// Full footprint if it fits now, else the chunked one; an Oom here is the typed error
/// of a card too small even for the fallback.
fn fallback_alloc<D: Device>(
    dev: &D,
    stream: &D::Stream,
    shape: &crate::device::Shape,
) -> Result<D::WorkingSet, crate::device::DeviceError> {
    match dev.alloc(stream, shape, Footprint::Full, AllocSite::Fallback) {
        Err(e) if e.is_oom() => dev.alloc(
            stream,
            shape,
            Footprint::Chunked,
            AllocSite::FallbackChunked,
        ),
        other => other,
    }
}

/// Under compute: the kernels, a sync of this worker's stream only, the results, and
/// the free, which makes the set truly free before `compute` is dropped (see
/// `Device::free`; the audit checks it at the release).
fn run_and_free<D: Device>(
    w: &Worker<D>,
    i: usize,
    compute: super::locks::Held<'_>,
    mut ws: D::WorkingSet,
    uploaded: Result<(), crate::device::DeviceError>,
) -> Result<G1Results, ProveError> {
    let (dev, stream, t) = (&*w.dev.device, &w.stream, &w.shared.timeline);
    let ran = uploaded.and_then(|()| {
        timed(t, i, w.who, Phase::WitnessMap, || {
            dev.witness_map(stream, &mut ws)
        })?;
        for job in Stage::MSMS {
            timed(t, i, w.who, msm_phase(job), || {
                dev.msm(stream, &mut ws, &w.dev.key, job)
            })?;
        }
        Ok(())
    });
    let synced = timed(t, i, w.who, Phase::Sync, || dev.sync_stream(stream));
    let results = ran.and(synced).and_then(|()| dev.results(stream, &ws));
    if let (Err(e), true) = (&results, flawed(w, Flaw::LeakLockOnError)) {
        std::mem::forget(compute);
        return Err(e.clone().into());
    }
    let compute = if flawed(w, Flaw::FreeAfterRelease) {
        drop(compute);
        None
    } else {
        Some(compute)
    };
    let freed = timed(t, i, w.who, Phase::Free, || {
        if flawed(w, Flaw::AsyncFreeBeforeRelease) {
            dev.flawed_free_unsynced(stream, ws)
        } else {
            dev.free(stream, ws)
        }
    });
    drop(compute);
    let results = results?;
    freed?;
    Ok(results)
}

fn msm_phase(job: Stage) -> Phase {
    match job {
        Stage::MsmH => Phase::MsmH,
        Stage::MsmL => Phase::MsmL,
        Stage::MsmA => Phase::MsmA,
        _ => Phase::MsmBG1,
    }
}
