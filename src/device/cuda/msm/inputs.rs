//! Inputs of an MSM: resident bases, scalars from host or device, and the zero / one /
//! other split the CPU prep makes.

use super::*;
use crate::device::cuda::staging::on_copy_threads;

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

/// The CPU prep's split of MSM scalars: the ones as a bitmap (bit i % 32 of word i / 32
/// is set iff scalar i is one), the others (neither 0 nor 1) as ascending indices with
/// their scalars. Zeros are in neither. Private fields keep every index below `len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitScalars {
    pub(super) len: usize,
    pub(super) ones: Vec<u32>,
    pub(super) ones_count: usize,
    pub(super) other_indices: Vec<u32>,
    pub(super) other_scalars: Vec<Fr>,
}

/// Classifies `scalars` (in parallel) into zero / one / other.
pub fn classify(scalars: &[Fr]) -> SplitScalars {
    let ones: Vec<u32> = (scalars.par_chunks(32))
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0, |w, (b, s)| w | u32::from(s.is_one()) << b)
        })
        .collect();
    let (other_indices, other_scalars) = (scalars.par_iter().enumerate())
        .filter(|(_, s)| !s.is_zero() && !s.is_one())
        .map(|(i, s)| (i as u32, *s))
        .unzip();
    let ones_count = ones.iter().map(|w| w.count_ones() as usize).sum();
    SplitScalars {
        len: scalars.len(),
        ones,
        ones_count,
        other_indices,
        other_scalars,
    }
}

impl SplitScalars {
    /// From the prep's [`ScalarClasses`] of `scalars`, without a rescan.
    ///
    /// It runs in the partition's upload, under mem: the scans and the gather of the
    /// others' scalars (all of them on a dense circuit) run on the staging module's copy
    /// threads, not on rayon's global pool, where the CPU prep's tasks would delay them.
    pub fn from_classes(classes: &ScalarClasses, scalars: &[Fr]) -> Result<Self, CudaError> {
        let len = classes.len;
        let bad = |i: &u32| *i as usize >= len.min(scalars.len());
        on_copy_threads(|| {
            let (ones_idx, others) = (&classes.ones, &classes.others);
            if len > MAX_LEN || ones_idx.par_iter().any(bad) || others.par_iter().any(bad) {
                return Err(invalid("scalar classes index past the scalars"));
            }
            let mut ones = vec![0u32; len.div_ceil(32)];
            ones_idx
                .iter()
                .for_each(|&i| ones[i as usize / 32] |= 1 << (i % 32));
            Ok(SplitScalars {
                len,
                ones_count: ones.iter().map(|w| w.count_ones() as usize).sum(),
                ones,
                other_scalars: others.par_iter().map(|&i| scalars[i as usize]).collect(),
                other_indices: others.clone(),
            })
        })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn ones_bitmap(&self) -> Bitmap<'_> {
        Bitmap {
            words: &self.ones,
            len: self.len,
        }
    }
    pub fn ones_count(&self) -> usize {
        self.ones_count
    }
    pub fn other_indices(&self) -> &[u32] {
        &self.other_indices
    }
    pub fn other_scalars(&self) -> &[Fr] {
        &self.other_scalars
    }
    pub fn zeros_count(&self) -> usize {
        self.len - self.ones_count - self.other_indices.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msm_classify_matches_scalar_classes() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(9);
        for n in [0usize, 1, 31, 32, 33, 100, 1000] {
            let s: Vec<Fr> = (0..n)
                .map(|i| match i % 5 {
                    0 | 3 => Fr::zero(),
                    1 => Fr::one(),
                    _ => Fr::rand(&mut rng),
                })
                .collect();
            let a = classify(&s);
            assert_eq!(
                a,
                SplitScalars::from_classes(&ScalarClasses::classify(&s), &s).unwrap()
            );
            assert_eq!(
                a.zeros_count() + a.ones_count() + a.other_indices().len(),
                n
            );
            for (i, x) in s.iter().enumerate() {
                assert_eq!(
                    a.ones_bitmap().words[i / 32] >> (i % 32) & 1 == 1,
                    x.is_one()
                );
            }
            assert!(a
                .other_scalars()
                .iter()
                .all(|x| !x.is_zero() && !x.is_one()));
        }
        let bad = ScalarClasses {
            len: 2,
            ones: vec![5],
            others: vec![],
        };
        assert!(SplitScalars::from_classes(&bad, &[Fr::one(); 2]).is_err());
    }
}
