//! One CUDA GPU: context, default stream, the embedded kernel modules (each loaded
//! once), checked launches, and the two VRAM allocation strategies.
//!
//! Every driver call's result comes back as a [`CudaError`] value; nothing on a
//! user-reachable path unwraps or panics. Asynchronous kernel faults surface at the
//! next synchronization, so [`Gpu::sync`] checks both the synchronize call and
//! cudarc's recorded error state (errors from `Drop` impls).
//!
//! # Memory
//!
//! cudarc's `CudaStream::alloc*` uses `cuMemAllocAsync` on the stream whenever the
//! device supports memory pools (every GPU this crate targets), and frees with
//! `cuMemFreeAsync` on drop: stream-ordered, pool-cached. The protocol must choose
//! explicitly, so [`Gpu::alloc_sync`] (`cuMemAlloc` / `cuMemFree`, memory back at the
//! device when free returns, free is device-synchronizing) and [`Gpu::alloc_async`]
//! (`cuMemAllocAsync` / `cuMemFreeAsync` on a given stream) both exist, as
//! [`DeviceBuffer`]s. Neither is event-tracked by cudarc: a buffer used on several
//! streams needs the caller's own events.

use std::marker::PhantomData;
// cudarc hands out std `Arc`s. The module cache uses std's `OnceLock`, which the sync
// facade does not mirror: this FFI layer is never loom-modelled (loom has no GPU).
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    DeviceSlice, DriverError, LaunchArgs, LaunchConfig, SyncOnDrop,
};
use thiserror::Error;

use crate::sync::Mutex;

use super::kernels::{ANCHORS, FATBINS};
use super::staging::{HostStaging, LentPinned, StagingCounts};
use crate::device::host::LentMemory;

/// Errors of the CUDA layer. Everything a user needs is in the variant.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CudaError {
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    #[error("no CUDA driver (libcuda) found on this machine")]
    NoDriver,
    #[error("no CUDA device with ordinal {ordinal}")]
    NoDevice { ordinal: usize },
    #[error("cannot load CUDA module `{module}`: {reason}")]
    Load {
        module: &'static str,
        reason: String,
    },
    #[error("kernel `{kernel}` not found in CUDA module `{module}`")]
    MissingKernel {
        module: &'static str,
        kernel: &'static str,
    },
    #[error("kernel `{kernel}` failed: {source}")]
    Launch {
        kernel: &'static str,
        source: DriverError,
    },
    #[error("out of device memory: requested {requested} bytes, {free} free")]
    Oom { requested: u64, free: u64 },
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

fn is_code(e: &DriverError, code: sys::cudaError_enum) -> bool {
    e.0 == code
}

/// One loaded-once module slot. `cell` is written only under `init`, so two threads
/// asking for the same module at once load it once (candle's read-then-write cache
/// could load twice); reads after that take no lock.
struct ModuleSlot {
    cell: OnceLock<Arc<CudaModule>>,
    init: Mutex<()>,
}

/// One GPU and its embedded kernel modules.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    total_mem: u64,
    /// One slot per entry of [`FATBINS`], same order.
    modules: Vec<ModuleSlot>,
    /// Per-size NTT twiddle tables, computed once per `Gpu` (see `ntt.rs`).
    pub(super) ntt_tables: super::ntt::TwiddleCache,
    /// Page-locked buffers every host→device copy goes through (see `staging.rs`).
    staging: HostStaging,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("total_mem", &self.total_mem)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context). No libcuda → [`CudaError::NoDriver`];
    /// no such device → [`CudaError::NoDevice`].
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        // cudarc panics inside `CudaContext::new` when libcuda cannot be loaded: probe.
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        match result::init() {
            Ok(()) => {}
            Err(e) if is_code(&e, sys::cudaError_enum::CUDA_ERROR_NO_DEVICE) => {
                return Err(CudaError::NoDevice { ordinal })
            }
            Err(e) => return Err(e.into()),
        }
        let count = CudaContext::device_count()?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(CudaError::NoDevice { ordinal });
        }
        let ctx = CudaContext::new(ordinal)?;
        let name = ctx.name()?;
        let total_mem = ctx.total_mem()? as u64;
        let stream = ctx.default_stream();
        let modules = FATBINS
            .iter()
            .map(|_| ModuleSlot {
                cell: OnceLock::new(),
                init: Mutex::new(()),
            })
            .collect();
        Ok(Gpu {
            ctx,
            stream,
            ordinal,
            name,
            total_mem,
            modules,
            ntt_tables: Default::default(),
            staging: HostStaging::from_env(),
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The context's default (legacy null) stream.
    pub fn default_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// A new non-blocking stream. (Puts cudarc in multi-stream mode: its own
    /// `CudaSlice`s then track uses with events.)
    ///
    /// A stream takes device memory of the driver's own (of a size it does not say):
    /// out of memory here is an [`CudaError::Oom`] like an allocation's. Seen on the
    /// H200: a squeeze that left the key room but not the workers' streams.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        self.ctx.new_stream().map_err(|e| self.oom(e, 0))
    }
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn total_mem(&self) -> u64 {
        self.total_mem
    }
    /// Bytes copied host→device so far, through page-locked staging and not.
    pub fn staging_counts(&self) -> StagingCounts {
        self.staging.counts()
    }
    /// Allocates page-locked staging buffers for `bytes` of uploads now (see
    /// [`HostStaging::reserve`]); returns how many were added.
    pub fn reserve_staging(&self, bytes: u64) -> Result<usize, CudaError> {
        self.staging.reserve(&self.ctx, bytes)
    }
    /// `len` zeroed elements of page-locked memory to lend to the prep (see
    /// [`LentPinned`]); the driver's out-of-memory error where the host has none.
    pub fn lend_pinned(&self, len: usize) -> Result<LentPinned, CudaError> {
        LentPinned::new(&self.ctx, len)
    }
    /// Async copy of all of `src` into the front of `dst` on `s`, straight from its
    /// page-locked memory, ordered before `s`'s later work; `src`'s writes and free
    /// wait for the copy. More values than `dst` holds is an error.
    pub fn upload_lent(
        &self,
        s: &Arc<CudaStream>,
        dst: &mut DeviceBuffer<super::layout::DevFr>,
        src: &LentPinned,
    ) -> Result<(), CudaError> {
        fits(src.frs().len(), dst.len())?;
        if src.frs().is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `dst` is live and holds at least as many values; `s` is ours and
        // its context is now current.
        unsafe { self.staging.upload_lent(&self.ctx, s, dst.raw(), src) }
    }
    /// Async copy of `src` into the front of `dst` on `s`, through page-locked staging
    /// (see `staging.rs`): `src` may be reused when this returns, and the copy is
    /// ordered before `s`'s later work. More values than `dst` holds is an error.
    pub fn upload_to<T: DeviceRepr>(
        &self,
        s: &Arc<CudaStream>,
        dst: &mut DeviceBuffer<T>,
        src: &[T],
    ) -> Result<(), CudaError> {
        fits(src.len(), dst.len())?;
        // SAFETY: `dst` is live and holds at least src.len() values.
        unsafe { upload(self, s, dst.raw(), src) }
    }
    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) = self.ctx.mem_get_info()?;
        Ok((free as u64, total as u64))
    }
    /// Number of multiprocessors (for sizing grids).
    pub fn sm_count(&self) -> Result<u32, CudaError> {
        let n = self
            .ctx
            .attribute(sys::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(n.max(1) as u32)
    }

    /// The module built from `cuda/<module>.cu`, loaded on first use and then cached.
    pub fn module(&self, module: &'static str) -> Result<Arc<CudaModule>, CudaError> {
        let Some(idx) = FATBINS.iter().position(|(name, _)| *name == module) else {
            return Err(CudaError::Load {
                module,
                reason: "no such module in FATBINS".into(),
            });
        };
        let slot = &self.modules[idx];
        if let Some(m) = slot.cell.get() {
            return Ok(m.clone());
        }
        // Slow path: the guard makes "check, load, store" one step (see ModuleSlot).
        let _guard = slot.init.lock();
        if let Some(m) = slot.cell.get() {
            return Ok(m.clone());
        }
        let image = cudarc::nvrtc::Ptx::from_binary(FATBINS[idx].1.to_vec());
        let m = self.ctx.load_module(image).map_err(|e| CudaError::Load {
            module,
            reason: format!("{e:?}"),
        })?;
        self.make_resident(&m, module)?;
        // Cannot already be set: every writer holds `init`.
        let _ = slot.cell.set(m.clone());
        Ok(m)
    }

    /// Loads every function of a freshly loaded module to the device and reserves the
    /// per-thread stack the largest needs. Under CUDA's lazy loading (the default) a
    /// kernel's code reaches the device at its first launch, and a launch that needs
    /// more stack than the context holds resizes local memory around it. Both allocate
    /// device memory in the middle of a batch, where a squeezed card fails the launch
    /// (seen on the H200: `msm_sum_chunks` OUT_OF_MEMORY at its first launch) and the
    /// leak check counts what stays. Loaded here, they belong to the warm-up instead.
    fn make_resident(&self, m: &Arc<CudaModule>, module: &'static str) -> Result<(), CudaError> {
        // The free VRAM at the failure names the cause of an out-of-memory load.
        let fail = |what: &str, e: DriverError| CudaError::Load {
            module,
            reason: match self.mem_info() {
                Ok((free, total)) => {
                    format!("{what}: {e:?} ({} of {} MiB free)", free >> 20, total >> 20)
                }
                Err(_) => format!("{what}: {e:?}"),
            },
        };
        let load_err = |e: DriverError| fail("making its kernels resident", e);
        let Some(&(_, anchor)) = ANCHORS.iter().find(|(name, _)| *name == module) else {
            return Err(CudaError::MissingKernel {
                module,
                kernel: "(build.rs found no anchor kernel)",
            });
        };
        let f = m.load_function(anchor).map_err(load_err)?;
        let mut hmod: sys::CUmodule = std::ptr::null_mut();
        let mut count = 0u32;
        // SAFETY: `f` is a live function of the live module `m`, which owns `hmod`; the
        // array holds `count` handles.
        let fns = unsafe {
            sys::cuFuncGetModule(&mut hmod, f.cu_function())
                .result()
                .map_err(load_err)?;
            sys::cuModuleGetFunctionCount(&mut count, hmod)
                .result()
                .map_err(load_err)?;
            let mut fns = vec![std::ptr::null_mut(); count as usize];
            sys::cuModuleEnumerateFunctions(fns.as_mut_ptr(), count, hmod)
                .result()
                .map_err(load_err)?;
            fns
        };
        let mut stack = 0usize;
        for func in fns {
            let mut local = 0i32;
            // SAFETY: `func` is one of the module's functions, enumerated above.
            unsafe {
                sys::cuFuncLoad(func).result().map_err(load_err)?;
                sys::cuFuncGetAttribute(
                    &mut local,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                    func,
                )
                .result()
                .map_err(load_err)?;
            }
            stack = stack.max(usize::try_from(local).unwrap_or(0));
        }
        let limit = sys::CUlimit::CU_LIMIT_STACK_SIZE;
        if stack > self.ctx.get_limit(limit).map_err(load_err)? {
            self.ctx
                .set_limit(limit, stack)
                .map_err(|e| fail(&format!("raising the stack limit to {stack} B"), e))?;
        }
        Ok(())
    }

    /// Kernel `kernel` of `module`.
    pub fn function(
        &self,
        module: &'static str,
        kernel: &'static str,
    ) -> Result<CudaFunction, CudaError> {
        let m = self.module(module)?;
        m.load_function(kernel).map_err(|e| {
            if is_code(&e, sys::cudaError_enum::CUDA_ERROR_NOT_FOUND) {
                CudaError::MissingKernel { module, kernel }
            } else {
                CudaError::Load {
                    module,
                    reason: format!("kernel {kernel}: {e:?}"),
                }
            }
        })
    }

    /// Launches a built kernel call, mapping a failed launch to [`CudaError::Launch`].
    /// Asynchronous faults of the kernel surface at the next [`Gpu::sync`].
    ///
    /// # Safety
    /// The arguments must match the kernel's signature, and every pointer must stay
    /// valid until the kernel has finished.
    pub unsafe fn launch(
        &self,
        kernel: &'static str,
        args: &mut LaunchArgs<'_>,
        cfg: LaunchConfig,
    ) -> Result<(), CudaError> {
        args.launch(cfg)
            .map(|_| ())
            .map_err(|source| CudaError::Launch { kernel, source })
    }

    /// Waits for `stream`, then checks for asynchronous errors: the synchronize result
    /// (a faulting kernel reports here) and cudarc's recorded error state. `what`
    /// names the work waited for, for the error.
    pub fn sync(&self, stream: &CudaStream, what: &'static str) -> Result<(), CudaError> {
        stream.synchronize().map_err(|source| CudaError::Launch {
            kernel: what,
            source,
        })?;
        self.ctx.check_err().map_err(|source| CudaError::Launch {
            kernel: what,
            source,
        })
    }

    /// Fills `buf` with 0xA5 bytes on `stream`, so an output a kernel fails to write
    /// is caught (no valid field element or point has that pattern everywhere: 0xA5…
    /// exceeds both moduli in the top limb).
    pub fn poison<T, B: DevicePtrMut<T>>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut B,
    ) -> Result<(), CudaError> {
        let bytes = buf.num_bytes();
        let (ptr, _rec) = buf.device_ptr_mut(stream);
        // SAFETY: `ptr` spans `bytes` bytes of a live buffer; the fill is ordered on
        // `stream`, after the buffer's prior writers (event tracking via `_rec`).
        unsafe { result::memset_d8_async(ptr, 0xA5, bytes, stream.cu_stream()) }?;
        Ok(())
    }

    /// A buffer of `len` values allocated as `kind` says.
    pub fn alloc<T>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
        kind: AllocKind,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        match kind {
            AllocKind::Sync => self.alloc_sync(stream, len),
            AllocKind::StreamOrdered => self.alloc_async(stream, len),
        }
    }

    /// `cuMemAlloc`: synchronous, not pooled. The memory is back at the device when
    /// [`DeviceBuffer::free`] returns, and that free (`cuMemFree`) is
    /// device-synchronizing: it waits for all work on the device.
    pub fn alloc_sync<T>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let bytes = byte_len::<T>(len)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: plain allocation; contents are unset (the buffer is raw bytes).
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| self.oom(e, bytes))?;
        Ok(DeviceBuffer::new(ptr, len, AllocKind::Sync, stream.clone()))
    }

    /// `cuMemAllocAsync` on `stream` (the device's default pool). Freed with
    /// `cuMemFreeAsync` on the same stream: the bytes return to the pool in stream
    /// order and to the device only at a sync of that stream (release threshold 0)
    /// or a pool trim.
    pub fn alloc_async<T>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let bytes = byte_len::<T>(len)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: `stream` is a live stream of this context.
        let ptr = unsafe { result::malloc_async(stream.cu_stream(), bytes.max(1)) }
            .map_err(|e| self.oom(e, bytes))?;
        Ok(DeviceBuffer::new(
            ptr,
            len,
            AllocKind::StreamOrdered,
            stream.clone(),
        ))
    }

    fn oom(&self, e: DriverError, requested: usize) -> CudaError {
        if is_code(&e, sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY) {
            let free = self.mem_info().map(|(f, _)| f).unwrap_or(0);
            CudaError::Oom {
                requested: requested as u64,
                free,
            }
        } else {
            e.into()
        }
    }
}

fn byte_len<T>(len: usize) -> Result<usize, CudaError> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| CudaError::InvalidInput(format!("buffer of {len} elements overflows")))
}

/// Grid for one thread per element, `block` threads per block.
pub fn grid_1d(n: usize, block: u32) -> Result<LaunchConfig, CudaError> {
    let blocks = n.div_ceil(block as usize);
    let blocks = u32::try_from(blocks)
        .map_err(|_| CudaError::InvalidInput(format!("{n} elements exceed one grid")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// How a [`DeviceBuffer`] was allocated, hence how it is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    /// `cuMemAlloc` / `cuMemFree`.
    Sync,
    /// `cuMemAllocAsync` / `cuMemFreeAsync` on the buffer's stream.
    StreamOrdered,
}

/// Device memory of `len` values of `T` (raw bytes to the GPU), freed by
/// [`DeviceBuffer::free`] (which reports errors) or on drop (which records them in the
/// context's error state, reported by the next [`Gpu::sync`]).
///
/// Implements cudarc's `DevicePtr`/`DevicePtrMut`, so cudarc's memcpy functions and
/// this crate's kernel wrappers accept it. It is not event-tracked: uses on streams
/// other than its own need the caller's events.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    ptr: CUdeviceptr,
    len: usize,
    kind: AllocKind,
    stream: Arc<CudaStream>,
    live: bool,
    _marker: PhantomData<*const T>,
}

// SAFETY: a device pointer with no host aliasing; all access goes through the driver.
unsafe impl<T> Send for DeviceBuffer<T> {}
// SAFETY: as above; shared references only read the pointer value.
unsafe impl<T> Sync for DeviceBuffer<T> {}

impl<T> DeviceBuffer<T> {
    fn new(ptr: CUdeviceptr, len: usize, kind: AllocKind, stream: Arc<CudaStream>) -> Self {
        Self {
            ptr,
            len,
            kind,
            stream,
            live: true,
            _marker: PhantomData,
        }
    }
    /// Number of `T` values.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn kind(&self) -> AllocKind {
        self.kind
    }
    /// The raw device address (valid while `self` lives).
    pub fn raw(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Frees now: `cuMemFree` (device-synchronizing) or `cuMemFreeAsync` on the
    /// buffer's stream (complete only at that stream's next sync).
    pub fn free(mut self) -> Result<(), CudaError> {
        self.release()
    }
    fn release(&mut self) -> Result<(), CudaError> {
        if !self.live {
            return Ok(());
        }
        self.live = false;
        // SAFETY: `ptr` came from the matching allocator and is freed exactly once
        // (`live` guards the second call from Drop); the context is live (the stream
        // holds it).
        unsafe {
            // Not cudarc's `bind_to_thread`: it first returns (and clears) a deferred
            // error of some earlier call, and this free would be skipped, its memory
            // lost until the context goes. Seen on the H200: a squeeze's ballast
            // survived its scenario and the next device had 5 MiB to load modules in.
            result::ctx::set_current(self.stream.context().cu_ctx())?;
            match self.kind {
                AllocKind::Sync => result::free_sync(self.ptr)?,
                AllocKind::StreamOrdered => result::free_async(self.ptr, self.stream.cu_stream())?,
            }
        }
        Ok(())
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let r = self.release();
        if let Err(CudaError::Driver(e)) = r {
            self.stream.context().record_err::<()>(Err(e));
        }
    }
}

impl<T> DeviceSlice<T> for DeviceBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for DeviceBuffer<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for DeviceBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

// `Gpu` is shared by worker threads (and by the tests through a static).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Gpu>();
    assert_send_sync::<DeviceBuffer<u8>>();
};

// ---------------------------------------------------------------------------------
// Raw helpers shared by the kernel drivers (msm/, g2.rs).

/// `CudaError::InvalidInput` with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> CudaError {
    CudaError::InvalidInput(msg.into())
}

/// `v` as a u32 kernel argument, or a typed error.
pub(crate) fn u32_of(v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| invalid(format!("{v} exceeds a u32 kernel argument")))
}

/// Async copy of `src` to the device address `dst` on `s`.
///
/// An upload of `values` into a buffer of `room`: an error if they do not fit.
fn fits(values: usize, room: usize) -> Result<(), CudaError> {
    if values > room {
        return Err(invalid(format!("{values} values into a buffer of {room}")));
    }
    Ok(())
}

/// # Safety
/// `dst` must hold `src.len()` values of `T`.
pub(crate) unsafe fn upload<T: DeviceRepr>(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    dst: CUdeviceptr,
    src: &[T],
) -> Result<(), CudaError> {
    if !src.is_empty() {
        gpu.context().bind_to_thread()?;
        // SAFETY: per the contract; the source is copied before this returns.
        unsafe { gpu.staging.upload(gpu.context(), s, dst, src) }?;
    }
    Ok(())
}

/// Downloads `dst.len()` values from `src`, then waits for the stream (checked).
///
/// # Safety
/// `src` must hold `dst.len()` values of `T`, for which every bit pattern is valid.
pub(crate) unsafe fn download<T>(
    gpu: &Gpu,
    s: &Arc<CudaStream>,
    src: CUdeviceptr,
    dst: &mut [T],
) -> Result<(), CudaError> {
    if !dst.is_empty() {
        gpu.context().bind_to_thread()?;
        // SAFETY: per the contract.
        unsafe { result::memcpy_dtoh_async(dst, src, s.cu_stream()) }?;
    }
    gpu.sync(s, "download")
}

/// Launches `kernel` of the calling module's `MODULE` with the given locals as
/// arguments (named locals, so that the pointers the launch builder keeps outlive the
/// launch).
macro_rules! launch {
    // `launch!(@module, gpu, …)`: a kernel of another module than the caller's MODULE.
    (@$module:expr, $gpu:expr, $stream:expr, $kernel:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let f = $gpu.function($module, $kernel)?;
        let mut args = $stream.launch_builder(&f);
        $( args.arg(&$arg); )*
        // SAFETY: as below.
        unsafe { $gpu.launch($kernel, &mut args, $cfg) }
    }};
    ($gpu:expr, $stream:expr, $kernel:expr, $cfg:expr; $($arg:ident),* $(,)?) => {{
        let f = $gpu.function(MODULE, $kernel)?;
        let mut args = $stream.launch_builder(&f);
        $( args.arg(&$arg); )*
        // SAFETY: every call site passes exactly the kernel's parameters (its C
        // signature is in a comment there) as u32 values or device addresses of live
        // buffers that the caller keeps allocated until the stream has run the kernel.
        unsafe { $gpu.launch($kernel, &mut args, $cfg) }
    }};
}
pub(crate) use launch;
