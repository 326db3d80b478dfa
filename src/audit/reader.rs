//! Reading every document of an index a page at a time, each page with its own time limit,
//! a failing page asked again smaller (the module doc of [`super`], "Reading a large store").

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{AuditReport, ViolationKind};
use crate::store::{Index, ScanPage, Store, StoreResult};
use crate::transfer::documents::{decode_source, Document};

/// Documents per page at first.
pub const PAGE: usize = 500;
/// The smallest page a failing page shrinks to.
pub const MIN_PAGE: usize = 10;
/// Attempts at one page (the same cursor) before the audit fails.
pub const PAGE_ATTEMPTS: u32 = 6;
/// Pause before asking a failed page again, times the attempt number.
const PAGE_BACKOFF: Duration = Duration::from_millis(200);
/// How often reading an index logs its progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Every document of an index: the readable ones, and the ids of those that do not decode.
pub(super) struct Loaded<T> {
    pub(super) docs: BTreeMap<String, T>,
    pub(super) unreadable: BTreeSet<String>,
}

impl<T> Loaded<T> {
    /// Documents, readable or not.
    pub(super) fn len(&self) -> usize {
        self.docs.len() + self.unreadable.len()
    }
}

pub(super) async fn load_all<T: Document>(
    store: &dyn Store,
    index: Index,
    report: &mut AuditReport,
) -> StoreResult<Loaded<T>> {
    let mut out = Loaded {
        docs: BTreeMap::new(),
        unreadable: BTreeSet::new(),
    };
    let mut after: Option<String> = None;
    let mut reader = PageReader::new(index);
    loop {
        let page = reader.next_page(store, after.as_deref()).await?;
        for doc in page.docs {
            match decode_source::<T>(&doc.source) {
                Ok(parsed) => {
                    out.docs.insert(doc.id, parsed);
                }
                Err(e) => {
                    report.violation(
                        ViolationKind::UnreadableDocument,
                        format!("{index}/{}: unreadable document: {e}", doc.id),
                    );
                    out.unreadable.insert(doc.id);
                }
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => {
                reader.done();
                return Ok(out);
            }
        }
    }
}

/// Reads one index page by page: shrinks the page on transient failures and logs progress
/// (see "Reading a large store" in the module docs).
struct PageReader {
    index: Index,
    page: usize,
    pages: u64,
    documents: u64,
    started: Instant,
    last_progress: Instant,
}

impl PageReader {
    fn new(index: Index) -> Self {
        let now = Instant::now();
        Self {
            index,
            page: PAGE,
            pages: 0,
            documents: 0,
            started: now,
            last_progress: now,
        }
    }

    /// The page after the cursor `after`, asked again smaller while it fails transiently.
    async fn next_page(&mut self, store: &dyn Store, after: Option<&str>) -> StoreResult<ScanPage> {
        let index = self.index;
        let mut attempt = 1;
        let page = loop {
            match store.scan(index, after, self.page).await {
                Ok(page) => break page,
                Err(error) if error.is_retryable() && attempt < PAGE_ATTEMPTS => {
                    let smaller = (self.page / 2).max(MIN_PAGE);
                    tracing::warn!(
                        %index, %error, attempt, page = self.page, next_page = smaller,
                        "audit: a page failed; asking again with a smaller page"
                    );
                    self.page = smaller;
                    tokio::time::sleep(PAGE_BACKOFF * attempt).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        self.pages += 1;
        self.documents += page.docs.len() as u64;
        if self.last_progress.elapsed() >= PROGRESS_EVERY {
            self.last_progress = Instant::now();
            tracing::info!(
                %index, pages = self.pages, documents = self.documents, page = self.page,
                "audit: reading"
            );
        }
        Ok(page)
    }

    fn done(&self) {
        tracing::info!(
            index = %self.index, pages = self.pages, documents = self.documents,
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "audit: index read"
        );
    }
}
