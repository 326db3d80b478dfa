//! Reading an account's statement (`docs/design.md §12`): its entries ([`super::entries`])
//! newest first, a page at a time, and its balance at a past instant.
//!
//! An entry is kept on the account until a written transfer document files it, so the two
//! together hold every entry, each `seq` at least once. `seq` runs from the statement's first
//! (`AccountDoc::statement_seqs`; 1 for an account opened with statements) without gaps, so a page is a range of `seq`: one search for the transfers filing that range
//! and the account's own copy, merged. A `seq` found in neither was filed by a write the
//! search does not show yet (Elasticsearch's searches see writes within the refresh interval):
//! the store is refreshed and the range read once more; still missing, the answer is
//! `Unavailable` (a `503`), never a statement with a hole in it.
//!
//! Times never go back within an account (`AccountDoc::record_entry`), so the entry at a time
//! is found by bisecting `seq`: about log2(entries) one-entry reads.

use std::ops::Range;

use super::documents::{decode, Documents};
use super::entries::{merge, Entry};
use super::model::{AccountDoc, TransferDoc};
use super::operations::ServiceError;
use crate::store::{DynStore, EntriesQuery, StoreError};
use crate::time::parse_millis;

/// What a page of a statement asks for.
#[derive(Debug, Clone, Default)]
pub struct StatementQuery {
    /// Only entries made after this instant (epoch ms, exclusive).
    pub after: Option<i64>,
    /// Only entries made before this instant (epoch ms, exclusive).
    pub before: Option<i64>,
    /// Continue below this `seq` (a cursor the previous page gave).
    pub below: Option<u64>,
    pub limit: u64,
}

/// One page, newest first, and the cursor of the next (`seq` to continue below).
#[derive(Debug, Clone)]
pub struct StatementPage {
    pub items: Vec<Entry>,
    pub next: Option<u64>,
}

/// The balance at an instant, and the entry that left it (none: the account's opening).
#[derive(Debug, Clone)]
pub struct PastBalance {
    pub balance: i64,
    pub entry: Option<Entry>,
}

/// An account's statement, read from the store.
pub struct Statements {
    store: DynStore,
    docs: Documents,
}

/// A statement of one account as read now.
struct Reading<'a> {
    statements: &'a Statements,
    account: AccountDoc,
}

impl Statements {
    /// Statements read from `store`.
    pub fn new(store: DynStore) -> Self {
        Self {
            docs: Documents::new(store.clone()),
            store,
        }
    }

    /// A page of `account`'s entries, newest first.
    pub async fn page(
        &self,
        account: &str,
        query: &StatementQuery,
    ) -> Result<StatementPage, ServiceError> {
        let reading = self.reading(account).await?;
        let seqs = reading.account.statement_seqs();
        let mut upper = query.below.unwrap_or(u64::MAX).min(seqs.end);
        if let Some(before) = query.before {
            upper = upper.min(reading.first_at_or_after(before).await?);
        }
        let floor = match query.after {
            Some(after) => reading.first_at_or_after(after + 1).await?,
            None => seqs.start,
        };
        let lower = upper.saturating_sub(query.limit).max(floor);
        if lower >= upper {
            return Ok(StatementPage {
                items: Vec::new(),
                next: None,
            });
        }
        let mut items = reading.entries(lower..upper).await?;
        items.reverse();
        Ok(StatementPage {
            items,
            next: (lower > floor).then_some(lower),
        })
    }

    /// `account`'s balance at `at` (epoch ms): after its last entry made at or before then.
    /// `Invalid` when the account was opened later, or its statement begins later (it was
    /// opened before this version kept statements).
    pub async fn balance_at(&self, account: &str, at: i64) -> Result<PastBalance, ServiceError> {
        let reading = self.reading(account).await?;
        let opened = parse_millis(&reading.account.creation_time).unwrap_or(i64::MIN);
        if at < opened {
            return Err(ServiceError::Invalid(format!(
                "account {account} was opened at {}, after `at`",
                reading.account.creation_time
            )));
        }
        let after = reading.first_at_or_after(at + 1).await?;
        if after > reading.account.statement_seqs().start {
            let entry = reading.one(after - 1).await?;
            return Ok(PastBalance {
                balance: entry.balance_after,
                entry: Some(entry),
            });
        }
        reading.opening_balance().await
    }

    async fn reading(&self, account: &str) -> Result<Reading<'_>, ServiceError> {
        let account = self
            .docs
            .get_vouched::<AccountDoc>(account)
            .await?
            .ok_or(ServiceError::NotFound)?
            .doc;
        Ok(Reading {
            statements: self,
            account,
        })
    }
}

impl Reading<'_> {
    /// The entries of `seqs`, in `seq` order, every one of them (see the module docs).
    async fn entries(&self, seqs: Range<u64>) -> Result<Vec<Entry>, ServiceError> {
        let found = self.filed_and_kept(seqs.clone()).await?;
        if found.len() as u64 == seqs.end - seqs.start {
            return Ok(found);
        }
        self.statements.store.refresh().await?;
        let found = self.filed_and_kept(seqs.clone()).await?;
        if found.len() as u64 == seqs.end - seqs.start {
            return Ok(found);
        }
        tracing::error!(
            account = %self.account.account_id,
            from = seqs.start,
            to = seqs.end,
            found = found.len(),
            "entries of the account are missing from its statement"
        );
        Err(StoreError::Unavailable(format!(
            "entries {}..{} of account {} are not all readable yet",
            seqs.start, seqs.end, self.account.account_id
        ))
        .into())
    }

    async fn filed_and_kept(&self, seqs: Range<u64>) -> Result<Vec<Entry>, ServiceError> {
        let account = self.account.account_id.as_str();
        let query = EntriesQuery {
            account: account.to_owned(),
            seqs: seqs.clone(),
            limit: (seqs.end - seqs.start) as usize,
        };
        let mut found: Vec<Entry> = self
            .account
            .kept_entries()
            .into_iter()
            .filter(|entry| seqs.contains(&entry.seq))
            .collect();
        for doc in self.statements.store.account_entries(&query).await? {
            let transfer = decode::<TransferDoc>(doc)?.doc;
            found.extend(
                transfer
                    .entries
                    .iter()
                    .filter_map(|text| Entry::decode_filed(text, &transfer.transaction_id))
                    .filter(|(of, entry)| of == account && seqs.contains(&entry.seq))
                    .map(|(_, entry)| entry),
            );
        }
        Ok(merge(found))
    }

    async fn one(&self, seq: u64) -> Result<Entry, ServiceError> {
        let mut found = self.entries(seq..seq + 1).await?;
        Ok(found.remove(0))
    }

    /// The first `seq` whose entry was made at or after `at`; one past the newest if none.
    async fn first_at_or_after(&self, at: i64) -> Result<u64, ServiceError> {
        let std::ops::Range {
            start: mut low,
            end: mut high,
        } = self.account.statement_seqs();
        if self.account.entry_at < at {
            return Ok(high);
        }
        while low < high {
            let middle = low + (high - low) / 2;
            if self.one(middle).await?.at < at {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        Ok(low)
    }

    /// The balance before the first entry: the opening balance, when the statement starts
    /// there.
    async fn opening_balance(&self) -> Result<PastBalance, ServiceError> {
        let account = &self.account;
        let seqs = account.statement_seqs();
        let before_first = if seqs.is_empty() {
            account.balance
        } else {
            let first = self.one(seqs.start).await?;
            first.balance_after - first.amount
        };
        if before_first != account.opening_balance {
            return Err(ServiceError::Invalid(format!(
                "the statement of account {} begins after `at`: it was opened before this \
                 service kept statements",
                account.account_id
            )));
        }
        Ok(PastBalance {
            balance: before_first,
            entry: None,
        })
    }
}
