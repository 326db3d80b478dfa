//! The store suites, in one test binary (each binary links the whole dependency tree, so fewer
//! binaries build faster), with the stores of the harness in `tests/support/stores.rs`:
//!
//! - [`backends`]: one store suite, same test names, on every backend (`embedded::`,
//!   `emulator::`, `real_es::`);
//! - [`es_backend`]: what only the Elasticsearch backend does, on the emulator (a test double);
//! - [`embedded_crash`]: the embedded store under `kill -9`;
//! - [`paging`]: the audit and recovery paging through ten thousand transfers on the emulator
//!   (a test double), whatever the lease.

#[path = "../support/mod.rs"]
mod support;

mod backends;
mod differential;
mod embedded_crash;
mod es_backend;
mod paging;
