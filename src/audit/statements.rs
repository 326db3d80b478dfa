//! The statement of every account (`docs/design.md §12`): its entries, gathered from the
//! transfers that filed them and from the account's own document, are numbered from the
//! statement's first (`AccountDoc::statement_seqs`) to `entry_seq` without a gap, each leaves the balance before it plus its amount, and the last
//! leaves the account's balance. A dropped entry is a gap; a doubled one breaks the running
//! sum.

use std::collections::BTreeMap;

use super::{AuditReport, ViolationKind};
use crate::transfer::entries::{merge, Entry};
use crate::transfer::model::{AccountDoc, TransferDoc};

/// Every filed entry, by account.
pub(super) fn filed_entries<'a>(
    transfers: impl Iterator<Item = &'a TransferDoc>,
) -> BTreeMap<String, Vec<Entry>> {
    let mut by_account: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for transfer in transfers {
        for text in &transfer.entries {
            if let Some((account, entry)) = Entry::decode_filed(text, &transfer.transaction_id) {
                by_account.entry(account).or_default().push(entry);
            }
        }
    }
    by_account
}

/// Checks one account's statement. An account without entries (none made yet, or opened
/// before statements and not written since) has nothing to check.
pub(super) fn check_statement(
    report: &mut AuditReport,
    id: &str,
    account: &AccountDoc,
    filed: Option<&Vec<Entry>>,
) {
    let range = account.statement_seqs();
    if range.is_empty() {
        return;
    }
    let mut entries = account.kept_entries();
    entries.extend(filed.into_iter().flatten().cloned());
    // Entries of a statement an older version's rewrite ended are numbered below it.
    let entries: Vec<Entry> = merge(entries)
        .into_iter()
        .filter(|e| e.seq >= range.start)
        .collect();
    let mut problem = |message: String| {
        report.violation(
            ViolationKind::StatementMismatch,
            format!("account {id}: {message}"),
        )
    };
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    if seqs != range.clone().collect::<Vec<_>>() {
        let wanted = range.end - range.start;
        return problem(format!(
            "its statement has {} entries where {wanted} are numbered",
            seqs.len()
        ));
    }
    for pair in entries.windows(2) {
        let (before, entry) = (&pair[0], &pair[1]);
        if before.balance_after as i128 + entry.amount as i128 != entry.balance_after as i128 {
            return problem(format!(
                "entry {} leaves {} after {} and a change of {}",
                entry.seq, entry.balance_after, before.balance_after, entry.amount
            ));
        }
    }
    let last = entries.last().expect("a non-empty range without a gap");
    if last.balance_after != account.balance {
        problem(format!(
            "its last entry ({}) leaves {}, its balance is {}",
            last.seq, last.balance_after, account.balance
        ));
    }
}
