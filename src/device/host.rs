//! Host memory for a partition's A·z, B·z, C·z ([`super::PartitionInputs`]): the heap,
//! or page-locked memory a device lent ([`super::Device::lend_host`]).
//!
//! Why: the prep writes these vectors and the device uploads them. From the heap an
//! upload first copies them into page-locked staging (384 MiB at 2^22, 40–60 ms beside
//! the next partition's prep, on the H200); the first partition's copy sits on the
//! batch's ramp-up, before the GPU's first compute. Lent memory is written in place by
//! the prep and sent with one async copy.

use std::any::Any;

use super::DeviceError;
use crate::Fr;

/// Page-locked host memory a device lends for one vector of field elements. The device
/// may read it asynchronously after an upload returns: [`LentMemory::frs_mut`] and the
/// memory's drop wait until its last read has finished.
pub trait LentMemory: Send + Sync + 'static {
    fn frs(&self) -> &[Fr];
    /// Write access, once every device read of the memory has finished.
    fn frs_mut(&mut self) -> Result<&mut [Fr], DeviceError>;
    /// For the lending device to recognise its own memory.
    fn as_any(&self) -> &dyn Any;
}

/// One of a partition's a, b, c vectors.
pub struct HostVec(Repr);

enum Repr {
    Heap(Vec<Fr>),
    Lent(Box<dyn LentMemory>),
}

impl HostVec {
    pub fn lent(memory: Box<dyn LentMemory>) -> HostVec {
        HostVec(Repr::Lent(memory))
    }

    /// The lent memory, if this is lent memory of type `T`.
    pub fn lent_as<T: LentMemory>(&self) -> Option<&T> {
        match &self.0 {
            Repr::Lent(m) => m.as_any().downcast_ref(),
            Repr::Heap(_) => None,
        }
    }

    pub fn is_lent(&self) -> bool {
        matches!(self.0, Repr::Lent(_))
    }

    /// `len` elements to overwrite (their values are unspecified): this memory, once
    /// the device no longer reads it, where it has that length; else the heap, which
    /// keeps its allocation where it can.
    pub fn writable(&mut self, len: usize) -> Result<&mut [Fr], DeviceError> {
        if let Repr::Lent(m) = &self.0 {
            if m.frs().len() != len {
                // Waits for the device's reads in its drop.
                self.0 = Repr::Heap(Vec::new());
            }
        }
        match &mut self.0 {
            Repr::Lent(m) => m.frs_mut(),
            Repr::Heap(v) => {
                if v.len() != len {
                    // In parallel: at 2^22 the pages' first touches are much of the work.
                    crate::reference::fill_parallel(v, len, |_| Fr::from(0u64));
                }
                Ok(v.as_mut_slice())
            }
        }
    }
}

impl Default for HostVec {
    fn default() -> Self {
        HostVec(Repr::Heap(Vec::new()))
    }
}

impl From<Vec<Fr>> for HostVec {
    fn from(v: Vec<Fr>) -> Self {
        HostVec(Repr::Heap(v))
    }
}

impl std::ops::Deref for HostVec {
    type Target = [Fr];
    fn deref(&self) -> &[Fr] {
        match &self.0 {
            Repr::Heap(v) => v,
            Repr::Lent(m) => m.frs(),
        }
    }
}

/// A copy on the heap (lent memory stays with its one owner).
impl Clone for HostVec {
    fn clone(&self) -> Self {
        HostVec(Repr::Heap(self.to_vec()))
    }
}

impl std::fmt::Debug for HostVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_lent() { "lent" } else { "heap" };
        write!(f, "HostVec({kind}, {} elements)", self.len())
    }
}

impl PartialEq for HostVec {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lent memory that counts the waits a write must make.
    struct Counted {
        frs: Vec<Fr>,
        waits: usize,
    }

    impl LentMemory for Counted {
        fn frs(&self) -> &[Fr] {
            &self.frs
        }
        fn frs_mut(&mut self) -> Result<&mut [Fr], DeviceError> {
            self.waits += 1;
            Ok(&mut self.frs)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn host_vec_writes_lent_memory_in_place_after_its_wait() {
        let mut v = HostVec::lent(Box::new(Counted {
            frs: vec![Fr::from(0u64); 4],
            waits: 0,
        }));
        v.writable(4).expect("writable")[2] = Fr::from(7u64);
        assert!(v.is_lent());
        assert_eq!(v[2], Fr::from(7u64));
        assert_eq!(v.lent_as::<Counted>().map(|c| c.waits), Some(1));
        // Another length leaves the lent memory for the heap.
        assert_eq!(v.writable(5).expect("writable").len(), 5);
        assert!(!v.is_lent());
        assert!(v.lent_as::<Counted>().is_none());
    }

    #[test]
    fn host_vec_heap_resizes_and_clones_to_the_heap() {
        let mut v = HostVec::from(vec![Fr::from(1u64); 3]);
        assert_eq!(v.writable(2).expect("writable").len(), 2);
        assert_eq!(v.len(), 2);
        let lent = HostVec::lent(Box::new(Counted {
            frs: vec![Fr::from(3u64); 2],
            waits: 0,
        }));
        let copy = lent.clone();
        assert!(!copy.is_lent());
        assert_eq!(copy, lent);
        assert_eq!(format!("{lent:?}"), "HostVec(lent, 2 elements)");
    }
}
