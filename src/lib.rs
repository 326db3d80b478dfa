//! transfer-service: atomic transfers between accounts stored in Elasticsearch, by the
//! two-phase commit Elastic published for multi-document transactions.
//!
//! # Layout
//! - [`store`]: the document store trait with Elasticsearch's single-document semantics, and
//!   its backends (`embedded` on redb, `elasticsearch` on the official client), plus a write
//!   coalescer (`grouping`).
//! - [`transfer`]: the engine: the protocol as pure decisions (`protocol`), the worker that
//!   drives a transfer with leases (`driver`), the recovery loop (`recovery`), and the
//!   operations the API calls (`service`).
//! - [`http`]: the axum API, one module per resource, problem+json errors, OpenAPI.
//! - [`app`]: wiring and graceful shutdown; [`config`]: flags and environment;
//!   [`metrics`]: Prometheus series; [`telemetry`]: logging; [`audit`]: the invariant check.

pub mod app;
pub mod audit;
pub mod config;
pub mod http;
pub mod metrics;
pub mod store;
pub mod telemetry;
pub mod transfer;
