//! `transfer-service audit`: checks the invariants of DESIGN §4 on the configured store and
//! exits non-zero with a readable report on any violation.
//!
//! What it checks, for every account `a`:
//! - exactness: `balance(a) = opening(a) + Σ finished credits − Σ finished debits + Σ deltas
//!   of the transfers still pending on a` (in-flight amounts are counted where the account
//!   says they are applied, so the check also holds while transfers are running);
//! - conservation: `Σ balance = Σ opening + Σ in-flight deltas`;
//! - no balance below its floor; uncommitted credits never exceed the balance above the floor;
//! - every pending id names a transfer that is in flight (not finished or rolled back) and
//!   involves the account;
//!
//! and for every transfer: its accounts exist or it rolled back; it is not stuck (in flight for
//! longer than `TRANSFER_TIMEOUT` plus two stale periods).
//!
//! With the embedded store, stop the service first: the redb file is held by one process.

use std::collections::HashMap;
use std::process::ExitCode;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{parse_millis, Index, Store, StoreResult};
use crate::transfer::model::{AccountDoc, TransferDoc, TransferState};
use crate::transfer::protocol::now_millis;

/// The outcome of one audit.
#[derive(Debug, Default, Clone)]
pub struct AuditReport {
    pub accounts: usize,
    pub transfers: usize,
    pub in_flight: usize,
    pub finished: usize,
    pub rolled_back: usize,
    pub total_balance: i128,
    pub total_opening: i128,
    /// Every invariant that does not hold, in words.
    pub violations: Vec<String>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Quiescent and clean: nothing in flight and every account's pending list empty.
    pub fn is_quiescent(&self) -> bool {
        self.in_flight == 0
    }
}

impl std::fmt::Display for AuditReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "accounts: {}, transfers: {} (finished {}, rolled back {}, in flight {})",
            self.accounts, self.transfers, self.finished, self.rolled_back, self.in_flight
        )?;
        writeln!(
            f,
            "total balance: {}, total opening balance: {}",
            self.total_balance, self.total_opening
        )?;
        if self.violations.is_empty() {
            write!(f, "OK: every invariant holds")
        } else {
            writeln!(f, "VIOLATIONS ({}):", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
            Ok(())
        }
    }
}

const PAGE: usize = 500;

async fn load_all<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    index: Index,
    violations: &mut Vec<String>,
) -> StoreResult<HashMap<String, T>> {
    let mut out = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.scan(index, after.as_deref(), PAGE).await?;
        let full = page.len() == PAGE;
        for doc in page {
            after = Some(doc.id.clone());
            match serde_json::from_value(doc.source) {
                Ok(parsed) => {
                    out.insert(doc.id, parsed);
                }
                Err(e) => violations.push(format!("{index}/{}: unreadable document: {e}", doc.id)),
            }
        }
        if !full {
            return Ok(out);
        }
    }
}

/// Audits the store. `stuck_after_millis`: an in-flight transfer older than this is reported.
pub async fn audit(store: &dyn Store, stuck_after_millis: i64) -> StoreResult<AuditReport> {
    store.refresh().await?;
    let mut report = AuditReport::default();
    let accounts: HashMap<String, AccountDoc> =
        load_all(store, Index::Accounts, &mut report.violations).await?;
    let transfers: HashMap<String, TransferDoc> =
        load_all(store, Index::Transactions, &mut report.violations).await?;
    report.accounts = accounts.len();
    report.transfers = transfers.len();

    // Expected balance per account from finished transfers.
    let mut expected: HashMap<&str, i128> = accounts
        .iter()
        .map(|(id, a)| (id.as_str(), a.opening_balance as i128))
        .collect();
    let now = now_millis();
    for (id, t) in &transfers {
        match t.transaction_state {
            TransferState::Finished => {
                report.finished += 1;
                for (account, delta) in [
                    (&t.src_acct, -(t.amount as i128)),
                    (&t.dest_acct, t.amount as i128),
                ] {
                    match expected.get_mut(account.as_str()) {
                        Some(e) => *e += delta,
                        None => report.violations.push(format!(
                            "transfer {id} finished but account {account} does not exist"
                        )),
                    }
                }
            }
            TransferState::RolledBack => report.rolled_back += 1,
            _ => {
                report.in_flight += 1;
                let created = parse_millis(&t.creation_time).unwrap_or(now);
                if now - created > stuck_after_millis {
                    report.violations.push(format!(
                        "transfer {id} is stuck in {} since {}",
                        t.transaction_state, t.creation_time
                    ));
                }
            }
        }
        if t.transaction_id != *id {
            report
                .violations
                .push(format!("transfer {id} says its id is {}", t.transaction_id));
        }
    }

    let mut in_flight_delta: i128 = 0;
    for (id, a) in &accounts {
        report.total_balance += a.balance as i128;
        report.total_opening += a.opening_balance as i128;
        let mut pending_delta: i128 = 0;
        let mut pending_credits: i128 = 0;
        for tid in &a.pending_transactions {
            let Some(t) = transfers.get(tid) else {
                report
                    .violations
                    .push(format!("account {id} has pending id {tid} of no transfer"));
                continue;
            };
            if t.transaction_state.is_terminal() {
                report.violations.push(format!(
                    "account {id} still has {tid} pending, but the transfer is {}",
                    t.transaction_state
                ));
            }
            if t.src_acct == *id {
                pending_delta -= t.amount as i128;
            } else if t.dest_acct == *id {
                pending_delta += t.amount as i128;
                pending_credits += t.amount as i128;
            } else {
                report.violations.push(format!(
                    "account {id} has {tid} pending, but the transfer does not involve it"
                ));
            }
        }
        in_flight_delta += pending_delta;
        let want = expected.get(id.as_str()).copied().unwrap_or_default() + pending_delta;
        if a.balance as i128 != want {
            report.violations.push(format!(
                "account {id}: balance {} but opening + finished transfers + pending = {want}",
                a.balance
            ));
        }
        if a.balance < a.floor {
            report.violations.push(format!(
                "account {id}: balance {} below floor {}",
                a.balance, a.floor
            ));
        }
        if a.pending_credits as i128 != pending_credits {
            report.violations.push(format!(
                "account {id}: pending_credits {} but its pending credits sum to {pending_credits}",
                a.pending_credits
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for tid in &a.pending_transactions {
            if !seen.insert(tid) {
                report
                    .violations
                    .push(format!("account {id} lists {tid} as pending twice"));
            }
        }
    }
    if report.total_balance != report.total_opening + in_flight_delta {
        report.violations.push(format!(
            "conservation: total balance {} ≠ total opening {} + in-flight {in_flight_delta}",
            report.total_balance, report.total_opening
        ));
    }
    report.violations.sort();
    Ok(report)
}

/// The `audit` command.
pub async fn run(config: Config) -> ExitCode {
    let metrics = Metrics::new();
    let store = match crate::app::open_store(&config, &metrics).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("audit: cannot open the store: {error}");
            return ExitCode::from(2);
        }
    };
    let stuck = config.transfer_timeout + config.recovery_stale_after * 2;
    match audit(store.as_ref(), stuck.as_millis() as i64).await {
        Ok(report) => {
            println!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("audit: store error: {error}");
            ExitCode::from(2)
        }
    }
}
