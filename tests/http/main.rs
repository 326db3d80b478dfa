//! The HTTP suites, in one test binary (each binary links the whole dependency tree, so fewer
//! binaries build faster): every test starts the real application on port 0 through the
//! harness in `tests/support/`.
//!
//! - [`api`]: the HTTP contract on the embedded store, the emulator and a real cluster;
//! - [`engines`]: Elasticsearch or OpenSearch, named at start, anything else refused;
//! - [`es_security`]: Elasticsearch with security on (API keys, privileges, HTTPS), on the
//!   emulator (a test double);
//! - [`holds`]: holds (capture, cancel, expiry) on the same backends;
//! - [`events`]: the change feed `GET /events`, on the same backends and with two instances;
//! - [`batch`]: `POST /transfers/batch`, item by item, on the same backends;
//! - [`currencies`]: account and transfer currencies, `currency_mismatch`, on the same backends;
//! - [`admission`]: `MAX_IN_FLIGHT`, 503 with `Retry-After`, on the same backends;
//! - [`cli`]: the command line: `--help`, and `audit` that only reads;
//! - [`auth`]: API keys on every protected route, reloads, the open routes;
//! - [`idempotency`]: the `Idempotency-Key` header on single and batch creates;
//! - [`metadata`]: metadata on accounts and transfers, and the listing filtered by it;
//! - [`schema`]: the OpenAPI document's constraints against the server, both ways;
//! - [`strict_input`]: unknown body fields and query parameters refused on every route;
//! - [`observability`]: metrics, request ids, logs, the OpenAPI document, Swagger UI;
//! - [`doc_examples`]: the README's and the API guide's curl examples run as written;
//! - [`generated_clients`]: Python, Java and TypeScript clients generated from the OpenAPI
//!   document run one scenario each;
//! - [`resilience`]: store outages on the Elasticsearch backend (emulator);
//! - [`webhooks`]: signed deliveries to a loopback receiver that fails and hangs, give-ups,
//!   transfers that never wait on it, two instances sharing a receiver's lease;
//! - [`operator_kit`]: the dashboard and alert rules in `deploy/` name only what `/metrics` has.
//!
//! Logs of every app in this binary go, as JSON, to one in-memory buffer (the process's one
//! global subscriber, installed by the harness); `TEST_LOG=1` also prints them.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod admission;
mod api;
mod auth;
mod batch;
mod cli;
mod currencies;
mod doc_examples;
mod engines;
mod es_security;
mod events;
mod generated_clients;
mod holds;
mod idempotency;
mod legs;
mod metadata;
mod observability;
mod operator_kit;
mod resilience;
mod schema;
mod statements;
mod strict_input;
mod webhooks;
