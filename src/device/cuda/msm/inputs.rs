//! Inputs of an MSM: resident bases and scalars from host or device (the zero / one /
//! other split is the CPU prep's [`ScalarClasses`]).

use super::*;

/// Affine G1 bases resident on one device (`g1_affine_t`, infinity as (0, 0)).
#[derive(Debug)]
pub struct DeviceBases {
    pub(super) buf: DeviceBuffer<DevG1Affine>,
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
    pub(super) ptr: CUdeviceptr,
    pub(super) len: usize,
    pub(super) _owner: PhantomData<&'a DeviceBases>,
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
    pub(super) ptr: CUdeviceptr,
    pub(super) len: usize,
    pub(super) _owner: PhantomData<&'a ()>,
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
