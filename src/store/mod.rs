//! The document store the protocol runs on.
//!
//! The trait offers exactly the single-document operations Elasticsearch gives us and nothing
//! more: a realtime get by id, create-if-absent (`op_type=create`), a conditional replace on
//! `(seq_no, primary_term)`, a batched write with per-item outcomes (`_bulk`), and two
//! near-real-time searches (stale transfers for recovery, a filtered listing for the API).
//! A store that has multi-document transactions (the embedded one) offers them as well
//! ([`Store::transact`]); the engine settles a transfer in one of them where it can
//! (`docs/design.md §3`, "In one transaction") and runs the two-phase protocol elsewhere.
//! Every backend keeps Elasticsearch's semantics, so the protocol cannot tell them apart:
//! `seq_no` increases on every applied write, a failed conditional write changes nothing, and
//! searches may lag behind writes (decisions are therefore always made on a realtime `get`).
//!
//! Backends: [`embedded::EmbeddedStore`] (redb, the default) and
//! [`elasticsearch::ElasticsearchStore`], with [`coalescer::WriteCoalescer`] coalescing its writes and
//! [`instrumented::InstrumentedStore`] counting requests for `/metrics`. Tests wrap stores in
//! a fault injector (`tests/support/faulty.rs`).

pub mod coalescer;
pub mod elasticsearch;
pub mod embedded;
pub mod instrumented;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;

/// The indices the service owns. Backends map them to physical names (Elasticsearch:
/// `INDEX_PREFIX` + [`Index::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Index {
    /// `accounts/{id}`: balance, pending transfer ids, settled-id tombstones.
    Accounts,
    /// `transactions/{id}`: one document per transfer (the post's name for the index).
    Transactions,
    /// `webhooks/{receiver}`: each webhook receiver's delivery progress (the durable feed
    /// cursor) and the lease of the instance delivering to it (`crate::webhooks`). Not part
    /// of the transfer protocol: the auditor and the feed never read it.
    Webhooks,
}

impl Index {
    pub const ALL: [Index; 3] = [Index::Accounts, Index::Transactions, Index::Webhooks];

    /// The logical name; Elasticsearch index names are `INDEX_PREFIX` + this.
    pub fn name(self) -> &'static str {
        match self {
            Index::Accounts => "accounts",
            Index::Transactions => "transactions",
            Index::Webhooks => "webhooks",
        }
    }
}

/// Elasticsearch's concurrency token: a write is conditional on both numbers matching the
/// live document. `seq_no` alone is not enough: it can repeat across primary terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Version {
    pub seq_no: u64,
    pub primary_term: u64,
}

/// A document's source: its JSON object as bytes, exactly as it is stored or as the store
/// answered it. Stores move sources without building a tree of them (the embedded store reads
/// only the few transfer fields its indexes need); the engine encodes its typed documents
/// straight into one and decodes each straight from one (`crate::transfer::documents`).
///
/// Made by [`Source::encode`] or from a [`Value`] (always JSON), or by a backend from bytes
/// the store gave it ([`Source::from_store`]); a backend that stores something else (a torn
/// write, a foreign document) hands it on as it is, and decoding it fails where it is read.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Source(Bytes);

impl Source {
    /// Serializes `value` as the source.
    pub fn encode<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        serde_json::to_vec(value).map(|bytes| Self(bytes.into()))
    }

    /// Bytes a store returned as a document's source, unchecked.
    pub fn from_store(bytes: impl Into<Bytes>) -> Self {
        Self(bytes.into())
    }

    /// Deserializes the source (borrowing from it where `T` allows).
    pub fn decode<'a, T: serde::Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.0)
    }

    /// The source as a JSON tree: for tests and tools, never the hot path.
    pub fn to_value(&self) -> serde_json::Result<Value> {
        self.decode()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, to hand to a request body without copying.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl From<Value> for Source {
    fn from(value: Value) -> Self {
        Self::from(&value)
    }
}

impl From<&Value> for Source {
    fn from(value: &Value) -> Self {
        Self(value.to_string().into_bytes().into())
    }
}

/// Compares as JSON (so tests can write `assert_eq!(doc.source, json!({..}))`); a source that
/// is not JSON equals nothing.
impl PartialEq<Value> for Source {
    fn eq(&self, other: &Value) -> bool {
        self.to_value().is_ok_and(|value| value == *other)
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Source({})", String::from_utf8_lossy(&self.0))
    }
}

/// A document as read from the store, with the token a conditional write must present.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub id: String,
    pub version: Version,
    pub source: Source,
}

/// One write of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Create the document; fails with [`WriteOutcome::AlreadyExists`] if the id is taken.
    Create {
        index: Index,
        id: String,
        source: Source,
    },
    /// Replace the document only if its live version is `expected`.
    ReplaceIf {
        index: Index,
        id: String,
        source: Source,
        expected: Version,
    },
}

impl WriteOp {
    pub fn index(&self) -> Index {
        match self {
            WriteOp::Create { index, .. } | WriteOp::ReplaceIf { index, .. } => *index,
        }
    }

    pub fn id(&self) -> &str {
        match self {
            WriteOp::Create { id, .. } | WriteOp::ReplaceIf { id, .. } => id,
        }
    }
}

/// What a single write did. Only `Written` changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Applied; the document's new version.
    Written(Version),
    /// `Create` on an id that exists (Elasticsearch 409 "document already exists").
    AlreadyExists,
    /// `ReplaceIf` whose expected version is not the live one (Elasticsearch 409).
    Conflict,
    /// `ReplaceIf` on a document that does not exist (Elasticsearch 409 "but no document was
    /// found").
    NotFound,
}

impl WriteOutcome {
    pub fn written(self) -> Option<Version> {
        match self {
            WriteOutcome::Written(v) => Some(v),
            _ => None,
        }
    }
}

/// Reads inside one of the store's write transactions ([`Store::transact`]): they see every
/// committed write, and the writes of the same transaction made before them.
pub trait TxnReads {
    fn get(&mut self, index: Index, id: &str) -> StoreResult<Option<Doc>>;
    /// The document's version only (its source is not copied).
    fn version(&mut self, index: Index, id: &str) -> StoreResult<Option<Version>>;
}

/// The work of a [`Store::transact`]: it reads what it needs inside the transaction and
/// answers the writes to make there. It runs on the store's committer, so it must be quick
/// and must not block.
///
/// **It must be pure**: no effect but the writes it returns (no I/O, no message sent, no
/// waiter woken, nothing changed that another task reads). It runs before its writes are
/// durable, and the transaction may still fail (the log write, the commit) or be lost to a
/// power cut; an effect it had would stand for writes that never happened. What the caller
/// needs of it besides the writes travels back only with the store's answer:
/// `Documents::transact` keeps the work's result until then and hands it over only with the
/// outcome (the embedded store's test
/// `a_transaction_whose_record_cannot_be_logged_answers_an_error_not_what_its_work_decided`).
pub type TxnWork = Box<dyn FnOnce(&mut dyn TxnReads) -> Vec<WriteOp> + Send>;

/// What a [`Store::transact`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every write was applied, durably: their new versions, in the order of the writes.
    Committed(Vec<Version>),
    /// A write's check failed (a version that is not the live one, an id that is taken, a
    /// missing document, the same document twice): none was applied.
    Refused,
}

/// Store failures. Outcomes that the protocol expects (conflicts, missing documents) are
/// never errors: they are [`WriteOutcome`]s and `Option`s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Transient: rejected under load (429), unavailable (503), timed out, connection
    /// dropped. The write may or may not have been applied: re-read before deciding again.
    #[error("store temporarily unavailable: {0}")]
    Unavailable(String),
    /// Permanent: a request the store refuses (a bug, a mapping problem, a broken file).
    /// Retrying the same request will not help.
    #[error("store error: {0}")]
    Permanent(String),
    /// The store refused the service's credentials (HTTP 401) or a privilege it needs (403).
    /// Retrying will not help until an operator fixes the credentials or the role; it is not
    /// an outage. `reason` says so in general terms (what `/readyz` shows); `detail` adds the
    /// store's own words (user, key id, indices) for the log.
    #[error("store access denied: {reason} ({detail})")]
    Denied { reason: String, detail: String },
}

/// What a vouch says of a read it could not vouch for because a read made again found the
/// document changed since: the document was written meanwhile, so reading it again at once
/// may well be vouched for (`Documents::get_vouched` does so).
pub const CHANGED_SINCE_READ: &str = "changed since it was read";

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// A vouch refused because the document changed since it was read
    /// ([`CHANGED_SINCE_READ`]).
    pub fn changed_since_read(&self) -> bool {
        matches!(self, StoreError::Unavailable(why) if why.contains(CHANGED_SINCE_READ))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Position in a sorted result: the sort timestamp (epoch milliseconds) and the transfer id
/// as tie-breaker. Pass the last item's key to get the next page.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SortKey {
    pub millis: i64,
    pub id: String,
}

/// Transfers that recovery should look at: in one of `states`, last modified before
/// `modified_before`, oldest first.
#[derive(Debug, Clone)]
pub struct StaleQuery {
    /// In-flight states: the embedded store keeps no recovery entries for terminal ones.
    pub states: Vec<String>,
    /// Epoch milliseconds: documents with `modification_time < modified_before`, and also
    /// those whose lease was released (no `lease_owner`), however recent.
    pub modified_before: i64,
    /// Continue after this key (exclusive), `(modification_time, id)` ascending.
    pub after: Option<SortKey>,
    pub limit: usize,
}

/// The API's transfer listing: newest first by `(creation_time, id)`.
#[derive(Debug, Clone, Default)]
pub struct TransferFilter {
    /// Transfers where this account is the source or the destination.
    pub account: Option<String>,
    pub state: Option<String>,
    /// Only transfers flagged for a person (see [`fields::ATTENTION`]).
    pub attention: bool,
    /// Only transfers whose `metadata` has each of these `(key, value)` pairs.
    pub metadata: Vec<(String, String)>,
    /// Continue after this key (exclusive), `(creation_time, id)` descending.
    pub after: Option<SortKey>,
    pub limit: usize,
}

/// The statement of one account (issue 48): every transfer document that files an entry of
/// `account` whose sequence number is in `seqs`, at most `limit` of them, in no particular
/// order (the caller sorts the entries it reads from them).
///
/// Entries are the strings of a transfer's `entries` ([`fields::ENTRIES`]), each
/// `<account>/<seq>/<rest>` ([`entries`]). A document matches when *any* of its entries does,
/// whatever else it files (entries of other accounts, other entries of this one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntriesQuery {
    pub account: String,
    /// From inclusive, to exclusive.
    pub seqs: std::ops::Range<u64>,
    /// Documents at most (0: none). Keep it at 10,000 or below: Elasticsearch refuses a
    /// larger page (`index.max_result_window`, `docs/elasticsearch.md` §7) as a permanent
    /// error, where the embedded store would answer.
    pub limit: usize,
}

/// The form of an entry value, which both backends read the same way: `<account>/<seq>/<rest>`,
/// `<account>` 1 to [`entries::ACCOUNT_MAX_LEN`] characters of `[A-Za-z0-9._:-]`, `<seq>`
/// exactly 20 decimal digits (a zero-padded `u64`), `<rest>` opaque to the stores.
///
/// Why a range of strings finds exactly one account's entries (Elasticsearch's query on the
/// keyword field, `docs/elasticsearch.md` §8): `"<account>/<from:020>" <= value <
/// "<account>/<to:020>"` holds for `<account>/<seq>/...` exactly when `from <= seq < to`
/// (20 digits sort as numbers). No value of another account falls in the range: a string
/// between two strings that start with `<account>/` starts with it too, and an account id
/// holds no `/`, so the value's account is `<account>` itself (`tests/store/backends.rs`
/// checks accounts like `a`, `a.b`, `a-b`, `a0`, `a:b`, `ab`). The embedded store parses the
/// values instead ([`entries::parse`]) and keys its index on `(account, seq)`; both agree on
/// well-formed values (a malformed one, which the engine never writes, the embedded store
/// skips while a range may match it).
pub mod entries {
    /// The longest account id an entry names.
    pub const ACCOUNT_MAX_LEN: usize = 128;
    /// The digits of an entry's sequence number.
    pub const SEQ_DIGITS: usize = 20;

    /// `<account>/<seq as 20 digits>`: the start of every entry of `account` at `seq`, and the
    /// bound of a range of them.
    pub fn bound(account: &str, seq: u64) -> String {
        format!("{account}/{seq:020}")
    }

    /// The account and sequence number of a well-formed entry value; `None` for any other
    /// string (a store skips it rather than fail the document's write).
    pub fn parse(value: &str) -> Option<(&str, u64)> {
        let (account, tail) = value.split_once('/')?;
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
        if account.is_empty() || account.len() > ACCOUNT_MAX_LEN || !account.chars().all(valid) {
            return None;
        }
        let digits = tail.get(..SEQ_DIGITS)?;
        if !digits.bytes().all(|b| b.is_ascii_digit())
            || tail.as_bytes().get(SEQ_DIGITS) != Some(&b'/')
        {
            return None;
        }
        Some((account, digits.parse().ok()?))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn an_entry_value_reads_as_its_account_and_seq() {
            let at = |seq: u64| format!("{}/1764371234567/-100/900/d", bound("a:b-c.d_e", seq));
            assert_eq!(parse(&at(7)), Some(("a:b-c.d_e", 7)));
            assert_eq!(parse(&at(u64::MAX)), Some(("a:b-c.d_e", u64::MAX)));
            // The bound of a range is an entry's start: 20 digits after the account.
            assert_eq!(bound("a", 12), "a/00000000000000000012");
        }

        #[test]
        fn a_malformed_entry_value_reads_as_nothing() {
            let long = "x".repeat(ACCOUNT_MAX_LEN + 1);
            for value in [
                "",
                "a",
                "/00000000000000000001/x",
                "a/1/x",
                "a/0000000000000000001/x",
                "a/000000000000000000001/x",
                "a/00000000000000000001",
                "a/0000000000000000000x/x",
                "a b/00000000000000000001/x",
                "é/00000000000000000001/x",
                "a/0000000000000000000é/x",
                "a/99999999999999999999/x",
                &format!("{long}/00000000000000000001/x"),
            ] {
                assert_eq!(parse(value), None, "{value:?}");
            }
        }
    }
}

/// A position in the change feed (`docs/design.md §11`): where a reader has read up to.
/// Each backend has its own kind; [`Store::changes`] refuses the other kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedPosition {
    /// The embedded store: the `seq_no` of the last transfer write served. Exact: a write
    /// committed later always has a higher one.
    Seq(u64),
    /// Elasticsearch: the `(modification_time, id)` of the last transfer served, below the
    /// horizon ([`ChangesQuery::horizon`]).
    Time(SortKey),
}

impl FeedPosition {
    /// The cursor text: `<seq_no>` or `<millis>~<id>`.
    pub fn encode(&self) -> String {
        match self {
            FeedPosition::Seq(seq_no) => seq_no.to_string(),
            FeedPosition::Time(key) => format!("{}~{}", key.millis, key.id),
        }
    }
}

/// A read of the change feed: transfer documents in the order of their latest writes.
#[derive(Debug, Clone)]
pub struct ChangesQuery {
    /// Continue after this position (exclusive); `None`: from the first transfer.
    pub after: Option<FeedPosition>,
    /// Epoch milliseconds: a backend that cannot order writes exactly (Elasticsearch) serves
    /// only documents with `modification_time` below it; the embedded store ignores it.
    pub horizon: i64,
    pub limit: usize,
    /// Only the newest document (below the horizon), whatever `after` and `limit` say: where
    /// the feed ends now.
    pub newest: bool,
}

/// One page of [`Store::changes`]: each document with its position, in feed order.
#[derive(Debug, Clone)]
pub struct ChangesPage {
    pub docs: Vec<(FeedPosition, Doc)>,
}

/// One page of a [`Store::scan`]. `next` is the cursor to pass for the following page, set
/// when the page was full (there may be more). It is opaque: Elasticsearch sorts on the id
/// repeated in the source, which a corrupt document may not share with its `_id`.
#[derive(Debug, Clone)]
pub struct ScanPage {
    pub docs: Vec<Doc>,
    pub next: Option<String>,
}

/// One page of a search. `next` is set when the page was full (there may be more).
#[derive(Debug, Clone)]
pub struct Page {
    pub docs: Vec<Doc>,
    pub next: Option<SortKey>,
}

/// The single-document operations the protocol needs, with Elasticsearch's semantics.
///
/// Searches (`find_stale`, `list_transfers`, `account_entries`) are near-real-time on Elasticsearch: a write may
/// take up to the refresh interval to show. Never decide on a search hit; `get` it first.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs and metrics ("embedded", "elasticsearch").
    fn backend(&self) -> &'static str;

    /// Realtime get by id: sees every acknowledged write.
    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>>;

    /// Vouches for what a [`Store::get`] of `id` answered (`read`: the version found, `None`:
    /// not found) before anything is answered or decided on it without a write of its own:
    /// `Ok` when it is a state the store keeps, not a write a cut-off primary accepted and
    /// will roll back nor a copy cut off from the writes it missed. `Unavailable` when that
    /// cannot be told now (read again later). A write conditional on the version read needs
    /// no vouching: its acknowledgement vouches for the version. The embedded store answers
    /// only what it committed; Elasticsearch asks the shard's checkpoints
    /// (`elasticsearch/vouch.rs`, `docs/design.md` §9 "Partitions").
    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        let _ = (index, id, read);
        Ok(())
    }

    /// Applies the writes in order, each on its own (not atomic as a whole, like `_bulk`),
    /// in one round trip. The result has one entry per op, in order.
    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>>;

    /// Transfers for recovery; see [`StaleQuery`].
    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page>;

    /// The API's listing; see [`TransferFilter`].
    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page>;

    /// The transfer documents filing entries of one account in a range of sequence numbers;
    /// see [`EntriesQuery`]. Near-real-time on Elasticsearch (a write may take up to the
    /// refresh interval to show, as for the listing); realtime on the embedded store.
    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>>;

    /// Reachable and migrated: what `/readyz` reports.
    async fn ready(&self) -> StoreResult<()>;

    /// Every document of `index` in id order, `limit` at a time, continuing from the cursor
    /// `after` (a previous page's `next`). Near-real-time on Elasticsearch. The auditor uses
    /// it.
    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage>;

    /// The change feed: transfer documents in the order of their latest writes, after
    /// `query.after`; see [`ChangesQuery`]. Refuses a position of another backend's kind
    /// with [`StoreError::Permanent`] (the service checks the kind first).
    async fn changes(&self, query: &ChangesQuery) -> StoreResult<ChangesPage>;

    /// Makes every acknowledged write visible to searches (Elasticsearch `_refresh`). Tests
    /// and the auditor use it; the engine never needs it.
    async fn refresh(&self) -> StoreResult<()>;

    /// What tells this store from every other: the embedded store's id (made when it was
    /// created), the Elasticsearch transfers index's uuid (a new one if the index is created
    /// again or restored). Change-feed cursors carry it, so that a cursor of another store
    /// is refused rather than read as a position of this one. `None`: the store has none.
    async fn identity(&self) -> StoreResult<Option<String>> {
        Ok(None)
    }

    /// The search engine behind the store once it has answered (Elasticsearch or OpenSearch,
    /// with its version); `None` for the embedded store, and before the engine has answered.
    fn engine(&self) -> Option<elasticsearch::SearchEngine> {
        None
    }

    /// Whether this store has multi-document transactions ([`Store::transact`]).
    /// Elasticsearch has none (`docs/elasticsearch.md`); the embedded store does.
    fn transactions(&self) -> bool {
        false
    }

    /// Runs `work` inside one write transaction and applies the writes it answers all
    /// together or not at all: each is checked like a [`Store::bulk`] op, and if any check
    /// fails none is applied ([`TxnOutcome::Refused`]). Committed means durable, as for every
    /// write; an error leaves the outcome unknown (re-read before deciding again). A store
    /// without transactions answers a permanent error.
    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        drop(work);
        Err(StoreError::Permanent(format!(
            "the {} store has no multi-document transactions",
            self.backend()
        )))
    }

    /// Create-if-absent for one document.
    async fn create(&self, index: Index, id: &str, source: Source) -> StoreResult<WriteOutcome> {
        let op = WriteOp::Create {
            index,
            id: id.to_owned(),
            source,
        };
        single(self.bulk(vec![op]).await?)
    }

    /// Conditional replace for one document.
    async fn replace_if(
        &self,
        index: Index,
        id: &str,
        source: Source,
        expected: Version,
    ) -> StoreResult<WriteOutcome> {
        let op = WriteOp::ReplaceIf {
            index,
            id: id.to_owned(),
            source,
            expected,
        };
        single(self.bulk(vec![op]).await?)
    }
}

fn single(mut results: Vec<StoreResult<WriteOutcome>>) -> StoreResult<WriteOutcome> {
    match (results.pop(), results.is_empty()) {
        (Some(result), true) => result,
        _ => Err(StoreError::Permanent(
            "bulk answered a different number of items than sent".into(),
        )),
    }
}

/// How the rest of the service holds a store.
pub type DynStore = Arc<dyn Store>;

/// A store that wraps another and changes some of what it does (the write coalescer, and the
/// tests' fault injectors): implement [`Forwarding::inner`] and override the operations that
/// differ; every other one goes to the inner store, and a blanket impl makes it a [`Store`].
/// The list of forwards is written here once, not once per wrapper, and a wrapper forwards
/// an operation added to [`Store`] without being touched.
#[async_trait]
pub trait Forwarding: Send + Sync + 'static {
    /// The store wrapped.
    fn inner(&self) -> &dyn Store;

    fn backend(&self) -> &'static str {
        self.inner().backend()
    }
    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.inner().get(index, id).await
    }
    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        self.inner().vouch(index, id, read).await
    }
    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        self.inner().bulk(ops).await
    }
    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        self.inner().find_stale(query).await
    }
    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        self.inner().list_transfers(filter).await
    }
    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        self.inner().account_entries(query).await
    }
    async fn ready(&self) -> StoreResult<()> {
        self.inner().ready().await
    }
    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        self.inner().scan(index, after, limit).await
    }
    async fn changes(&self, query: &ChangesQuery) -> StoreResult<ChangesPage> {
        self.inner().changes(query).await
    }
    async fn refresh(&self) -> StoreResult<()> {
        self.inner().refresh().await
    }
    async fn identity(&self) -> StoreResult<Option<String>> {
        self.inner().identity().await
    }
    fn engine(&self) -> Option<elasticsearch::SearchEngine> {
        self.inner().engine()
    }
    fn transactions(&self) -> bool {
        self.inner().transactions()
    }
    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        self.inner().transact(work).await
    }
}

#[async_trait]
impl<T: Forwarding> Store for T {
    fn backend(&self) -> &'static str {
        Forwarding::backend(self)
    }
    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        Forwarding::get(self, index, id).await
    }
    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        Forwarding::vouch(self, index, id, read).await
    }
    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        Forwarding::bulk(self, ops).await
    }
    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        Forwarding::find_stale(self, query).await
    }
    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        Forwarding::list_transfers(self, filter).await
    }
    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        Forwarding::account_entries(self, query).await
    }
    async fn ready(&self) -> StoreResult<()> {
        Forwarding::ready(self).await
    }
    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        Forwarding::scan(self, index, after, limit).await
    }
    async fn changes(&self, query: &ChangesQuery) -> StoreResult<ChangesPage> {
        Forwarding::changes(self, query).await
    }
    async fn refresh(&self) -> StoreResult<()> {
        Forwarding::refresh(self).await
    }
    async fn identity(&self) -> StoreResult<Option<String>> {
        Forwarding::identity(self).await
    }
    fn engine(&self) -> Option<elasticsearch::SearchEngine> {
        Forwarding::engine(self)
    }
    fn transactions(&self) -> bool {
        Forwarding::transactions(self)
    }
    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        Forwarding::transact(self, work).await
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The fields of a transfer document the stores index for their searches. Kept here so both
/// backends read them the same way.
pub mod fields {
    pub const STATE: &str = "transaction_state";
    pub const SRC: &str = "src_acct";
    pub const DEST: &str = "dest_acct";
    pub const CREATED: &str = "creation_time";
    pub const MODIFIED: &str = "modification_time";
    /// Absent (or null) when nobody holds the transfer's lease: a transfer released at a
    /// shutdown is a recovery candidate at once, whatever its `modification_time`.
    pub const LEASE_OWNER: &str = "lease_owner";
    /// The transfer id repeated in the source: Elasticsearch 8 cannot sort on `_id`, and
    /// cursors need a unique tie-breaker.
    pub const ID: &str = "transaction_id";
    /// The account id repeated in the account source, for the same reason.
    pub const ACCOUNT_ID: &str = "account_id";
    /// The receiver id repeated in a webhook progress document, for the same reason.
    pub const RECEIVER_ID: &str = "receiver_id";
    /// Why a person must look at the transfer; absent on every transfer that needs nobody.
    /// Mapped (as a keyword) by migration `0003_transactions_attention`. A transfer is
    /// flagged when this field holds a string (what the engine writes): Elasticsearch's
    /// `exists` query on the keyword field matches exactly those documents (a `null` or an
    /// absent field is not indexed), and the embedded store's index keeps the same ones, so
    /// both backends list the same transfers.
    pub const ATTENTION: &str = "attention";
    /// The client's labels: an object of strings, absent on most transfers. Mapped as
    /// `flattened` (OpenSearch: `flat_object`) by migration `0004_transactions_metadata`; a filter on key `k` is a `term`
    /// query on `metadata.k` (`docs/elasticsearch.md` §8).
    pub const METADATA: &str = "metadata";
    /// Every account a multi-leg transaction touches (a string array, absent on one-leg
    /// transfers, which the listing finds by `src_acct`/`dest_acct`). Mapped as a keyword by
    /// migration `0005_transactions_accounts`; the listing by account is a `term` on it or on
    /// either party.
    pub const ACCOUNTS: &str = "accounts";
    /// The account entries a transfer files (a string array, absent on transfers written
    /// before statements), each `<account>/<seq>/<rest>` ([`super::entries`]). Mapped as a
    /// keyword by migration `0007_transactions_entries`; [`super::Store::account_entries`]
    /// is a `range` on it.
    pub const ENTRIES: &str = "entries";
}
