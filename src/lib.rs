//! transfer-service: atomic transfers between accounts stored in Elasticsearch, by the
//! two-phase commit Elastic published for multi-document transactions.
//!
//! # Layout
//! [`store`] (documents with Elasticsearch's semantics, and the backends) under [`transfer`]
//! (the engine) under [`http`], [`webhooks`] and [`audit`], wired by [`app`] from [`config`].
//! Which module may import which: [`layers`], held to the tree by a test. The module map,
//! file by file, is `docs/design.md` §1 (a test keeps it naming every source file).

pub mod app;
pub mod audit;
pub mod auth;
pub mod config;
pub mod http;
pub mod layers;
pub mod metrics;
pub mod store;
pub mod telemetry;
pub mod time;
pub mod trace_context;
pub mod transfer;
pub mod webhooks;
