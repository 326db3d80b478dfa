//! The late-apply sweep: the line of defence that does not depend on any clock.
//!
//! A terminal transfer never has a legitimate entry in an account's `pending_transactions`:
//! `finished` is written only after both accounts settled it, `rolled-back` only after both
//! undid it. An entry found there anyway was applied late, by a worker that still believed
//! it held the lease (its host's clock was wrong, or its VM was suspended past the lease)
//! after the tombstone that would have refused it was gone. The sweep undoes such an entry
//! with the ordinary rollback step (a conditional write; it takes the amount back and
//! leaves a tombstone), counts it in `late_applies_compensated_total` and logs it at WARN.
//!
//! What a late apply does before the sweep reaches it (`docs/design.md §9`):
//! - a late **credit** raises the balance but stays in `pending_credits`: it is never
//!   spendable, so nobody can move those units before the sweep takes them back;
//! - a late **debit** lowers the balance (never below the floor: it was checked like any
//!   debit) until the sweep gives it back; meanwhile other debits from that account may be
//!   refused with `insufficient_funds` that would have been accepted.
//!
//! Why undoing is safe: the sweep acts only on a transfer it read as terminal, and no
//! legitimate worker acts on a terminal transfer; the undo is a conditional write on the
//! account as it was decided on, so it cannot interleave with another write of it.
//!
//! Cost: the sweep pages through the accounts a bounded number of pages per recovery tick
//! and reads a transfer only for entries older than a lease (their applied time is recorded
//! with them): young entries belong to transfers still being driven.

use std::collections::HashMap;
use std::time::Duration;

use tracing::warn;

use super::accounts::{StepRequest, StepResult};
use super::documents::decode;
use super::model::{AccountDoc, TransferDoc};
use super::protocol::{AccountOp, CurrencyRule};
use super::recovery::Recovery;
use crate::store::{Index, StoreResult};

/// What one page of the sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepPage {
    /// Accounts looked at.
    pub accounts: usize,
    /// Pending entries old enough to check.
    pub checked: usize,
    /// Late applies undone.
    pub compensated: usize,
    /// Where the next page starts (`None`: the pass is complete).
    pub next: Option<String>,
}

impl Recovery {
    /// Sweeps one page of accounts after `after` (the start when `None`).
    pub async fn sweep_late_applies(&self, after: Option<&str>) -> StoreResult<SweepPage> {
        let page = self
            .store
            .scan(Index::Accounts, after, self.shared.config.recovery_page)
            .await?;
        let older_than =
            self.shared.clock.wall_millis() - self.shared.config.lease.as_millis() as i64;
        let mut report = SweepPage {
            accounts: page.docs.len(),
            next: page.next,
            ..SweepPage::default()
        };
        // A transfer read once per page, however many accounts name it.
        let mut transfers: HashMap<String, Option<TransferDoc>> = HashMap::new();
        for doc in page.docs {
            let Ok(account) = decode::<AccountDoc>(doc) else {
                // Unreadable: the audit reports it; nothing here can be decided on it.
                continue;
            };
            for (transfer_id, applied_at) in account.doc.pending_with_times() {
                if applied_at >= older_than {
                    continue;
                }
                report.checked += 1;
                if !transfers.contains_key(transfer_id) {
                    let read = self
                        .shared
                        .docs
                        .get_vouched::<TransferDoc>(transfer_id)
                        .await?;
                    transfers.insert(transfer_id.to_owned(), read.map(|t| t.doc));
                }
                let Some(Some(transfer)) = transfers.get(transfer_id) else {
                    continue;
                };
                if self.undo_late_apply(&account.doc, transfer).await {
                    report.compensated += 1;
                }
            }
        }
        Ok(report)
    }

    /// Sweeps up to `pages` pages from `cursor`, wrapping to the start after the last page;
    /// returns the cursor to go on from and the late applies undone.
    pub async fn sweep_some(
        &self,
        cursor: Option<String>,
        pages: usize,
    ) -> (Option<String>, usize) {
        let mut cursor = cursor;
        let mut compensated = 0;
        for _ in 0..pages {
            match self.sweep_late_applies(cursor.as_deref()).await {
                Ok(page) => {
                    compensated += page.compensated;
                    cursor = page.next;
                    if cursor.is_none() {
                        break;
                    }
                }
                Err(error) => {
                    warn!(%error, "late-apply sweep failed; the next tick retries");
                    break;
                }
            }
        }
        (cursor, compensated)
    }

    /// Undoes `account`'s pending entry of `transfer` if the transfer is terminal.
    async fn undo_late_apply(&self, account: &AccountDoc, transfer: &TransferDoc) -> bool {
        if !transfer.transaction_state.is_terminal() {
            return false;
        }
        // The account's one entry carries its net change over all the transfer's legs.
        let Some(posting) = transfer.posting_of(&account.account_id) else {
            // An entry of a transfer that does not touch this account: only the audit can
            // say what it is; undoing it would guess.
            return false;
        };
        let (side, amount) = (posting.side, posting.amount);
        let request = StepRequest {
            transfer_id: transfer.transaction_id.clone(),
            amount,
            settle_amount: amount,
            side,
            op: AccountOp::Undo,
            currency: CurrencyRule::Any,
            report_currency: false,
            // Not a lease holder: what makes this safe is the terminal state read above.
            deadline: self.shared.clock.boot_time() + Duration::from_secs(3600),
            // The entry seen, and only it: if it is gone, someone undid it first.
            mark: account
                .pending_mark(&transfer.transaction_id)
                .map(str::to_owned),
            hold: transfer.is_hold(),
            // The late entry and its undo stay on the account until a later transfer
            // there files them: this one's documents are final.
            filed: Vec::new(),
        };
        match self.shared.accounts.run(&account.account_id, request).await {
            // Someone (another instance's sweep) undid it first.
            StepResult::AlreadyDone => false,
            StepResult::Done => {
                self.shared.metrics.late_applies_compensated_total.inc();
                warn!(
                    transfer_id = %transfer.transaction_id,
                    account = %account.account_id,
                    state = %transfer.transaction_state,
                    amount,
                    side = side.as_str(),
                    "a late apply of a terminal transfer was undone"
                );
                true
            }
            other => {
                warn!(
                    transfer_id = %transfer.transaction_id,
                    account = %account.account_id,
                    result = ?other,
                    "cannot undo a late apply yet; the next pass retries"
                );
                false
            }
        }
    }
}
