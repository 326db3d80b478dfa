//! The one test harness every suite shares (`tests/http/`, `tests/store/`, `tests/engine/`,
//! `tests/process.rs`):
//!
//! - [`app`]: the real application on port 0, on the embedded store, on the Elasticsearch
//!   emulator (the `es-emulator` crate, a TEST DOUBLE of Elasticsearch) or on a real
//!   Elasticsearch cluster, with a client whose helpers read like sentences;
//! - [`cluster`]: real Elasticsearch clusters from `tools/es-cluster/run`, one shared per test
//!   binary, or one of a test's own with several nodes it can stop and start;
//! - [`problems`]: the checks of an error answer (RFC 9457 problem+json);
//! - [`routes`]: every route of the API with the scope it needs, in one list;
//! - [`stores`]: a bare store on each of those backends, for the store suites;
//! - [`cut_off`]: a store seen through a primary cut off from its replicas: writes it
//!   accepted and never acknowledged show in reads, unvouched, until it heals;
//! - [`gate`]: a store wrapper that holds account writes until the test opens it (transfers
//!   kept in flight without sleeps);
//! - [`engine`]: the engine without HTTP, on real storage behind [`faulty`] (injected faults),
//!   on a test clock and tokio's paused time;
//! - [`step_faults`]: the fault suites' cases, one step boundary under one fault each, an
//!   instance A that injects it and a recoverer that takes over;
//! - [`keys`]: API key files, each key hashed by docs/api.md's recipe;
//! - [`metrics`]: `/metrics` read with a maintained Prometheus text parser;
//! - [`logs`]: every app's JSON log lines captured in memory, found by request or transfer id;
//! - [`feed`]: what a change-feed consumer saw, and the check that it is complete and in order;
//! - [`receiver`]: a webhook receiver on loopback that records, fails or hangs, and the
//!   checks of its deliveries (every event, signatures, order per transfer);
//! - [`wait`]: waiting on a condition with a deadline (never a fixed sleep);
//! - [`faketime`]: a child process whose wall clock is offset (libfaketime);
//! - [`jaeger`]: a real trace backend (Jaeger) per test, and the spans of a trace as it holds them;
//! - [`old_version`]: the service as an older commit built it (the rolling-upgrade test);
//! - [`skip`]: a test whose tool is missing fails under CI and skips loudly elsewhere.
//!
//! Each binary uses part of the harness, so unused items are expected in any one of them.
#![allow(dead_code)]

/// Runs each named `cases::<case>(backend)` of the calling module as a test on every
/// backend: `embedded`, `emulator` (the test double) and `real_es` (a real cluster from
/// [`cluster`]; it says why it skips where none can run).
#[allow(unused_macros)]
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(super::Backend::Embedded).await;
                }
            )*
        }
        mod emulator {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(super::Backend::Emulator).await;
                }
            )*
        }
        mod real_es {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if crate::support::stores::real_cluster().is_none() {
                        return;
                    }
                    super::cases::$case(super::Backend::RealEs).await;
                }
            )*
        }
    };
}

/// Runs the calling module's `case(backend)` as one test per name given, each on its backend
/// (for a case whose backends are named in the test's name; [`on_every_backend`] names them
/// by module). The doc comments given go on the tests.
#[allow(unused_macros)]
macro_rules! case_on_backends {
    ($case:ident: $($(#[$doc:meta])* $test:ident => $backend:ident),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                $case(crate::support::app::Backend::$backend).await;
            }
        )+
    };
}

pub mod app;
pub mod cluster;
pub mod cut_off;
pub mod engine;
pub mod faketime;
pub mod faulty;
pub mod feed;
pub mod gate;
pub mod jaeger;
pub mod keys;
pub mod logs;
pub mod metrics;
pub mod old_version;
pub mod problems;
pub mod receiver;
pub mod routes;
pub mod skip;
pub mod step_faults;
pub mod stores;
pub mod wait;
