//! transfer-service: atomic transfers between accounts stored in Elasticsearch, by the
//! two-phase commit Elastic published for multi-document transactions.
//!
//! # Layout
//! - [`store`]: the document store trait with Elasticsearch's single-document semantics, and
//!   its backends (`embedded` on redb, `elasticsearch` on the official client with its
//!   `migrations`), a write coalescer (`grouping`) and a metrics wrapper (`instrumented`).
//! - [`transfer`]: the engine: the protocol as pure decisions (`protocol`), the documents
//!   (`model`) and their typed I/O (`documents`), the clock it is given (`clock`), the lease
//!   and every transfer write (`lease`), the worker that drives a transfer (`driver`),
//!   account steps merged per account (`accounts`), the recovery loop (`recovery`), the
//!   late-apply sweep (`sweep`), store retries (`retry`), the bound on transfers in flight
//!   (`admission`), and the operations the API calls (`service`).
//! - [`http`]: the axum API, one module per resource (`accounts`, `transfers`, `batch`,
//!   `health`), bearer-key authentication (`auth`), problem+json errors (`error`), OpenAPI
//!   and Swagger UI (`openapi`).
//! - [`auth`]: the API keys of `API_KEYS_FILE`: parsing, constant-time lookup, reloads.
//! - [`webhooks`]: the change feed's events POSTed to `WEBHOOK_URL`s, signed per Standard
//!   Webhooks (`signing`), from a durable cursor under a delivery lease (`progress`), one
//!   dispatcher per URL (`dispatcher`).
//! - [`app`]: wiring and graceful shutdown; [`config`]: flags and environment;
//!   [`metrics`]: Prometheus series; [`telemetry`]: logging; [`audit`]: the invariant check
//!   behind `transfer-service audit`.

pub mod app;
pub mod audit;
pub mod auth;
pub mod config;
pub mod http;
pub mod metrics;
pub mod store;
pub mod telemetry;
pub mod transfer;
pub mod webhooks;
