//! Host→device copies through page-locked staging buffers.
//!
//! An async copy from pageable memory is not asynchronous: the driver stages it through
//! its own small buffers, so a large one holds the calling thread until the stream has
//! reached it and moved most of it (about 4 GB/s in the pipeline, docs/benchmarks.md).
//! Under the compute lock that drains the GPU's queue before every split MSM's scalar
//! upload. Here a copy is cut into chunks of [`CHUNK`] bytes; each is copied on the host
//! (in parallel) into a page-locked buffer and sent with a truly async copy, so the
//! host fills chunk i + 1 while the link moves chunk i, and returns without waiting for
//! the stream. The caller's source is free again when the upload returns.
//!
//! The largest upload, a partition's a, b, c, needs no host copy at all: the device
//! lends the prep page-locked memory for them ([`LentPinned`]), which the prep writes in
//! place and [`Gpu::upload_lent`](super::context::Gpu::upload_lent) sends with one
//! async copy.
//!
//! A buffer is refilled only once the copy that last read it has finished (its event
//! says so): a chunk takes an idle, finished buffer, or a new one while the pool has
//! fewer than [`MAX_BUFFERS`], and otherwise the pageable path. Never waiting for a
//! buffer keeps one stream's queue from stalling another thread's upload. Without
//! page-locked memory (the allocation fails, or `TWOLOCK_PAGEABLE_UPLOADS=1` for a
//! comparison) every copy takes the pageable path, logged once.
//!
//! Pinning memory is slow (tens of ms per 100 MiB) and the CUDA guide lists a
//! page-locked allocation among the operations that may serialize streams, so
//! [`HostStaging::reserve`] allocates one partition's worth before a batch (with the
//! key): otherwise the batch's first upload pins its buffers under the mem lock, on the
//! ramp-up before the GPU's first compute.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUdeviceptr, CUevent_flags, CUresult};
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaStream, DeviceRepr, DriverError, PinnedHostSlice,
};
use rayon::prelude::*;

use super::context::CudaError;
use crate::device::host::LentMemory;
use crate::device::DeviceError;
use crate::sync::Mutex;
use crate::Fr;

/// Bytes per staging buffer: large against a copy's fixed cost, small enough that the
/// host's fill of one chunk overlaps the transfer of the one before.
pub const CHUNK: usize = 32 << 20;
/// Buffers per GPU: at most 1 GiB of page-locked host memory.
pub const MAX_BUFFERS: usize = 32;
/// Bytes per parallel host copy within a chunk.
const PIECE: usize = 1 << 20;
/// Set to 1: every host→device copy takes the pageable path (for comparisons).
pub const PAGEABLE_ENV: &str = "TWOLOCK_PAGEABLE_UPLOADS";

struct Staged {
    /// Freed only once no copy can still read it (see the Drop impl).
    mem: ManuallyDrop<PinnedHostSlice<u8>>,
    /// Recorded after the copy that last read `mem`.
    done: CudaEvent,
}

impl Staged {
    /// A staging buffer: write-combined, as the host only writes it.
    fn new(ctx: &Arc<CudaContext>) -> Result<Staged, DriverError> {
        Self::with(ctx, CHUNK, sys::CU_MEMHOSTALLOC_WRITECOMBINED)
    }

    fn with(ctx: &Arc<CudaContext>, bytes: usize, flags: u32) -> Result<Staged, DriverError> {
        // The event first: `mem` is not freed by unwinding (ManuallyDrop) until Staged exists.
        let done = ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        // SAFETY: the bytes are written before any copy reads them (by `fill`, or by
        // the prep through `LentPinned::frs_mut`, which zeroes them first).
        let mem = ManuallyDrop::new(unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags) }?);
        Ok(Staged { mem, done })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Raw calls: cudarc's would first hand back (and clear) an error some other
        // object recorded, skip the wait, and free memory a copy may still be reading.
        // If the wait fails, the buffer is leaked rather than freed under a copy.
        let ctx = self.done.context().cu_ctx();
        // SAFETY: the context is live (the event holds it); the event is ours.
        let waited = unsafe {
            result::ctx::set_current(ctx)
                .and_then(|()| result::event::synchronize(self.done.cu_event()))
        };
        match waited {
            // SAFETY: dropped once, here, after the last copy that read it.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.mem) },
            Err(e) => {
                tracing::error!(error = %e, "staging buffer leaked: its last copy could not be awaited")
            }
        }
    }
}

/// Page-locked memory lent to the prep for one of a partition's a, b, c
/// ([`crate::device::Device::lend_host`]): written in place, then sent by
/// [`Gpu::upload_lent`](super::context::Gpu::upload_lent) with one async copy and no
/// host copy. Cached (not write-combined): the prep reads back what it wrote. Every copy from it records
/// `done`; a write ([`LentMemory::frs_mut`]) and the free (Staged's drop) wait for it.
pub struct LentPinned {
    buf: Staged,
    ptr: *mut Fr,
    len: usize,
    /// One copy's wait, copy and record at a time, so `done` follows every copy.
    copying: Mutex<()>,
}

// SAFETY: `ptr` addresses `buf`'s memory, owned by this value; shared access only
// reads it (`frs`), and writes need `&mut self` after the device's reads (`frs_mut`).
unsafe impl Send for LentPinned {}
// SAFETY: as above; `copying` serializes the copies' event bookkeeping.
unsafe impl Sync for LentPinned {}

impl LentPinned {
    /// `len` zeroed elements of cached page-locked memory in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<LentPinned, CudaError> {
        let bytes = len
            .checked_mul(std::mem::size_of::<Fr>())
            .ok_or_else(|| CudaError::InvalidInput(format!("{len} elements to lend")))?;
        let mut buf = Staged::with(ctx, bytes.max(1), 0)?;
        let ptr = buf.mem.as_mut_ptr()?.cast::<Fr>();
        // SAFETY: `ptr` addresses `bytes` page-aligned bytes no copy reads yet.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(LentPinned {
            buf,
            ptr,
            len,
            copying: Mutex::new(()),
        })
    }

    fn context(&self) -> &Arc<CudaContext> {
        self.buf.done.context()
    }
}

impl LentMemory for LentPinned {
    fn frs(&self) -> &[Fr] {
        // SAFETY: `len` initialized elements (zeroed at creation: a valid Fr), read-only
        // here; the device only reads them too.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn frs_mut(&mut self) -> Result<&mut [Fr], DeviceError> {
        self.buf.done.synchronize().map_err(CudaError::from)?;
        // SAFETY: as in `frs`, and no copy reads them any more (`done` has completed;
        // new copies need `&self`, excluded by `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[derive(Default)]
struct Pool {
    /// Buffers not being filled, oldest use first (some may still be in flight).
    idle: VecDeque<Staged>,
    /// Buffers that exist, idle or being filled.
    allocated: usize,
}

/// Bytes sent each way since the GPU was opened (see [`HostStaging::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagingCounts {
    /// Through page-locked buffers.
    pub staged: u64,
    /// From pageable memory (no buffer free, or staging off).
    pub pageable: u64,
    /// Straight from page-locked memory lent to the prep ([`LentPinned`]).
    pub lent: u64,
}

/// One GPU's pool of page-locked staging buffers.
pub struct HostStaging {
    pool: Mutex<Pool>,
    /// Staging is off: set from [`PAGEABLE_ENV`] or after a failed allocation.
    off: AtomicBool,
    staged: AtomicU64,
    pageable: AtomicU64,
    lent: AtomicU64,
}

impl HostStaging {
    /// A pool that stages unless `TWOLOCK_PAGEABLE_UPLOADS=1`.
    pub fn from_env() -> HostStaging {
        let off = std::env::var(PAGEABLE_ENV).is_ok_and(|v| v == "1");
        if off {
            tracing::info!("{PAGEABLE_ENV}=1: host-to-device copies from pageable memory");
        }
        HostStaging {
            pool: Mutex::new(Pool::default()),
            off: AtomicBool::new(off),
            staged: AtomicU64::new(0),
            pageable: AtomicU64::new(0),
            lent: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> StagingCounts {
        StagingCounts {
            staged: self.staged.load(Ordering::Relaxed),
            pageable: self.pageable.load(Ordering::Relaxed),
            lent: self.lent.load(Ordering::Relaxed),
        }
    }

    /// An idle buffer whose last copy has finished, a new one, or None (pageable).
    fn take(&self, ctx: &Arc<CudaContext>) -> Result<Option<Staged>, CudaError> {
        if self.off.load(Ordering::Relaxed) {
            return Ok(None);
        }
        {
            let mut pool = self.pool.lock();
            for i in 0..pool.idle.len() {
                if pool.idle[i].done.try_is_complete()? {
                    return Ok(pool.idle.remove(i));
                }
            }
            if !Self::claim(&mut pool, MAX_BUFFERS) {
                return Ok(None);
            }
        }
        self.new_buffer(ctx)
    }

    /// Counts one more buffer if the pool holds fewer than `cap` (the caller makes it
    /// with [`Self::new_buffer`]).
    fn claim(pool: &mut Pool, cap: usize) -> bool {
        let free = pool.allocated < cap;
        pool.allocated += usize::from(free);
        free
    }

    /// Allocates buffers until the pool holds enough for `bytes` (at most
    /// [`MAX_BUFFERS`]); returns how many it added. Out of page-locked memory it stops
    /// early and staging goes off, as in an upload.
    pub fn reserve(&self, ctx: &Arc<CudaContext>, bytes: u64) -> Result<usize, CudaError> {
        let want = usize::try_from(bytes.div_ceil(CHUNK as u64))
            .unwrap_or(MAX_BUFFERS)
            .min(MAX_BUFFERS);
        let mut added = 0;
        while !self.off.load(Ordering::Relaxed) {
            if !Self::claim(&mut self.pool.lock(), want) {
                break;
            }
            // A buffer never copied from: its unrecorded event reads as complete.
            match self.new_buffer(ctx)? {
                Some(b) => self.pool.lock().idle.push_back(b),
                None => break,
            }
            added += 1;
        }
        Ok(added)
    }

    /// A new buffer already counted in `allocated` (uncounted again if it fails), or
    /// None once page-locked memory ran out (staging then goes off).
    fn new_buffer(&self, ctx: &Arc<CudaContext>) -> Result<Option<Staged>, CudaError> {
        match Staged::new(ctx) {
            Ok(b) => Ok(Some(b)),
            Err(e) => {
                self.pool.lock().allocated -= 1;
                if e.0 != CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    return Err(e.into());
                }
                if !self.off.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "no page-locked staging: host-to-device copies from pageable memory");
                }
                Ok(None)
            }
        }
    }

    /// Async copy of all of `src` to `dst` on `s`, straight from its page-locked memory;
    /// `src` records the copy (its writes and its free wait for it). Memory lent by
    /// another context is sent through staging.
    ///
    /// # Safety
    /// As [`HostStaging::upload`].
    pub(crate) unsafe fn upload_lent(
        &self,
        ctx: &Arc<CudaContext>,
        s: &Arc<CudaStream>,
        dst: CUdeviceptr,
        src: &LentPinned,
    ) -> Result<(), CudaError> {
        if src.context().cu_ctx() != ctx.cu_ctx() {
            // SAFETY: per the contract.
            return unsafe { self.upload(ctx, s, dst, super::layout::fr_as_dev(src.frs())) };
        }
        let _one = src.copying.lock();
        // After any earlier copy from it (on another stream, say), so `done` covers both.
        s.wait(&src.buf.done)?;
        let bytes = std::mem::size_of_val(src.frs());
        // SAFETY: `src` holds `bytes` page-locked bytes, not written while `done` is
        // pending (see LentPinned); `dst` per the contract.
        let sent = unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.ptr.cast_const().cast(), bytes, s.cu_stream())
                .result()
        };
        sent?;
        if let Err(e) = src.buf.done.record(s) {
            // In flight with no record of it: wait here (raw, as in Staged's drop).
            // SAFETY: a stream of the current context.
            unsafe { result::stream::synchronize(s.cu_stream()) }?;
            return Err(e.into());
        }
        self.lent.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Async copy of `src` to `dst` on `s`; `src` may be reused when this returns.
    ///
    /// # Safety
    /// `dst` must address `size_of_val(src)` bytes of live device memory of `ctx`, `s`
    /// must be a stream of `ctx` current on this thread, and `T` plain data.
    pub(crate) unsafe fn upload<T: DeviceRepr>(
        &self,
        ctx: &Arc<CudaContext>,
        s: &Arc<CudaStream>,
        dst: CUdeviceptr,
        src: &[T],
    ) -> Result<(), CudaError> {
        let size = std::mem::size_of::<T>();
        if size == 0 || size > CHUNK {
            // SAFETY: per the contract (nothing to stage, or a value past a buffer).
            return Ok(unsafe { result::memcpy_htod_async(dst, src, s.cu_stream()) }?);
        }
        let mut at = dst;
        for part in src.chunks(CHUNK / size) {
            let len = std::mem::size_of_val(part);
            match self.take(ctx)? {
                Some(mut b) => {
                    let to = match b.mem.as_mut_ptr() {
                        Ok(to) => to,
                        Err(e) => {
                            self.pool.lock().idle.push_back(b);
                            return Err(e.into());
                        }
                    };
                    // SAFETY: `to` holds CHUNK ≥ len bytes, disjoint from `part`.
                    unsafe { fill(to, part.as_ptr().cast(), len) };
                    // SAFETY: the len bytes just written (a raw pointer: no `&[u8]` over
                    // a type's bytes); `at` per the contract.
                    let sent = unsafe {
                        sys::cuMemcpyHtoDAsync_v2(at, to.cast_const().cast(), len, s.cu_stream())
                            .result()
                    };
                    let recorded = sent.and_then(|()| b.done.record(s));
                    if sent.is_ok() && recorded.is_err() {
                        // In flight with no event to say when it ends: wait (raw, as in
                        // Drop), then free; if even that fails, leak it.
                        self.pool.lock().allocated -= 1;
                        // SAFETY: a stream of the current context.
                        match unsafe { result::stream::synchronize(s.cu_stream()) } {
                            Ok(()) => drop(b),
                            Err(_) => std::mem::forget(b),
                        }
                    } else {
                        self.pool.lock().idle.push_back(b);
                    }
                    recorded?;
                    self.staged.fetch_add(len as u64, Ordering::Relaxed);
                }
                None => {
                    // SAFETY: as above; a pageable source is read before this returns.
                    unsafe { result::memcpy_htod_async(at, part, s.cu_stream()) }?;
                    self.pageable.fetch_add(len as u64, Ordering::Relaxed);
                }
            }
            at += len as u64;
        }
        Ok(())
    }
}

/// Threads for the host side of uploads (filling staging buffers, gathering the split
/// MSMs' scalars), in a pool of their own: on rayon's global pool a fill queued behind
/// the CPU prep's tasks, and a 384 MiB upload took 100–190 ms (2026-12-06, H100 host),
/// slower than the pageable copy it replaced. [`COPY_THREADS_ENV`] overrides it (for
/// comparisons).
const COPY_THREADS: usize = 4;
/// Set to a count in 1..=64: that many copy threads instead of the default 4.
pub const COPY_THREADS_ENV: &str = "TWOLOCK_COPY_THREADS";

/// [`COPY_THREADS`], or a valid [`COPY_THREADS_ENV`] (an invalid one is logged and ignored).
fn copy_threads() -> usize {
    match std::env::var(COPY_THREADS_ENV) {
        Err(_) => COPY_THREADS,
        Ok(v) => match v.parse::<usize>() {
            Ok(n @ 1..=64) => n,
            _ => {
                tracing::warn!("{COPY_THREADS_ENV}={v:?} is not a count in 1..=64: {COPY_THREADS} copy threads");
                COPY_THREADS
            }
        },
    }
}

fn copy_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(copy_threads())
            .thread_name(|i| format!("twolock-copy-{i}"))
            .build()
            .map_err(|e| tracing::warn!(error = %e, "no copy threads: host copies on the caller"))
            .ok()
    })
    .as_ref()
}

/// Runs `f` on the copy threads (rayon calls inside it use them), or on the caller
/// where they could not be started.
pub fn on_copy_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match copy_pool() {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Copies `len` bytes from `from` to `to`, in parallel pieces on the copy threads.
///
/// # Safety
/// `from` and `to` must address `len` bytes each, not overlapping.
unsafe fn fill(to: *mut u8, from: *const u8, len: usize) {
    let (to, from) = (to as usize, from as usize);
    on_copy_threads(|| {
        (0..len.div_ceil(PIECE)).into_par_iter().for_each(|i| {
            let (off, n) = (i * PIECE, PIECE.min(len - i * PIECE));
            // SAFETY: bytes [off, off + n) of both, per the contract; pieces are disjoint.
            unsafe {
                std::ptr::copy_nonoverlapping((from + off) as *const u8, (to + off) as *mut u8, n)
            }
        })
    });
}
