//! The crate-level error: one variant per layer, each layer keeping its own typed enum.

use thiserror::Error;

/// Any error twolock returns at its outer API (the CLI, the stress runner).
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Circuit(#[from] crate::circuits::CircuitError),
    #[error(transparent)]
    Key(#[from] crate::keys::KeyError),
    #[error(transparent)]
    Reference(#[from] crate::reference::ReferenceError),
    #[error(transparent)]
    Prove(#[from] crate::prover::ProveError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error("verification failed to run: {0}")]
    Verify(String),
    #[error("{0}")]
    Usage(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
