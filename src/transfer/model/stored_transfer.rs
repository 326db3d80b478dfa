//! The stored form of a [`TransferDoc`]: the JSON every version of the service reads and
//! Elasticsearch's `transactions` mapping indexes, field for field and in this order, as it
//! was before the document was typed (`the_stored_form_is_pinned` holds it byte for byte).
//! Reading moves the fields into the typed document; writing borrows them (a transfer is
//! written on every step: nothing is cloned, nothing buffered). The fields' meaning is
//! documented on [`TransferDoc`] and [`Legs`].

use serde::{Deserialize, Serialize};

use super::{Leg, Legs, Metadata, RollbackReason, TransferDoc, TransferState};
use crate::time::Timestamp;

/// A transfer document as read: the one-leg fields and the multi-leg ones side by side.
#[derive(Deserialize)]
pub(super) struct StoredTransfer {
    transaction_id: String,
    #[serde(default)]
    src_acct: String,
    #[serde(default)]
    dest_acct: String,
    amount: i64,
    #[serde(default)]
    legs: Vec<Leg>,
    #[serde(default)]
    accounts: Vec<String>,
    transaction_state: TransferState,
    #[serde(default)]
    reason: Option<RollbackReason>,
    creation_time: Timestamp,
    modification_time: Timestamp,
    #[serde(default)]
    lease_owner: Option<String>,
    #[serde(default)]
    lease_expires_at: Option<Timestamp>,
    #[serde(default)]
    attention: Option<String>,
    #[serde(default)]
    failed_account: Option<String>,
    #[serde(default)]
    hold_expires_at: Option<Timestamp>,
    #[serde(default)]
    captured_amount: Option<i64>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    history: String,
    #[serde(default)]
    created_by: Option<String>,
    #[serde(default)]
    settled_by: Option<String>,
    #[serde(default)]
    applied_marks: Vec<String>,
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    entries: Vec<String>,
}

/// A transfer document as written: [`StoredTransfer`]'s fields, borrowed from the typed
/// document, each empty or unset one left out.
#[derive(Serialize)]
struct StoredTransferRef<'a> {
    transaction_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    src_acct: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    dest_acct: &'a str,
    amount: i64,
    #[serde(skip_serializing_if = "<[Leg]>::is_empty")]
    legs: &'a [Leg],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    accounts: &'a [String],
    transaction_state: TransferState,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<RollbackReason>,
    creation_time: Timestamp,
    modification_time: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_owner: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attention: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed_account: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_expires_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    captured_amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<&'a str>,
    #[serde(skip_serializing_if = "Metadata::is_empty")]
    metadata: &'a Metadata,
    #[serde(skip_serializing_if = "str::is_empty")]
    history: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settled_by: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    applied_marks: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entries: &'a [String],
}

/// Why a stored transfer does not make a [`TransferDoc`]: its fields mix a one-leg transfer
/// with a multi-leg one, which no version writes.
#[derive(Debug, thiserror::Error)]
#[error("the document mixes one leg (`src_acct`, `dest_acct`) and several (`legs`, `accounts`)")]
pub(super) struct MixedLegs;

impl TryFrom<StoredTransfer> for TransferDoc {
    type Error = MixedLegs;

    fn try_from(mut stored: StoredTransfer) -> Result<Self, MixedLegs> {
        let legs = stored.legs()?;
        Ok(TransferDoc {
            transaction_id: stored.transaction_id,
            legs,
            transaction_state: stored.transaction_state,
            reason: stored.reason,
            creation_time: stored.creation_time,
            modification_time: stored.modification_time,
            lease_owner: stored.lease_owner,
            lease_expires_at: stored.lease_expires_at,
            attention: stored.attention,
            failed_account: stored.failed_account,
            hold_expires_at: stored.hold_expires_at,
            captured_amount: stored.captured_amount,
            currency: stored.currency,
            metadata: stored.metadata,
            history: stored.history,
            created_by: stored.created_by,
            settled_by: stored.settled_by,
            applied_marks: stored.applied_marks,
            traceparent: stored.traceparent,
            entries: stored.entries,
        })
    }
}

impl StoredTransfer {
    /// The legs the stored fields describe, taken out of them: a multi-leg transaction when
    /// `legs` is there (then without `src_acct`/`dest_acct`), else one leg (then without
    /// `accounts`).
    fn legs(&mut self) -> Result<Legs, MixedLegs> {
        if self.legs.is_empty() {
            if !self.accounts.is_empty() {
                return Err(MixedLegs);
            }
            return Ok(Legs::OneLeg(Leg {
                from: std::mem::take(&mut self.src_acct),
                to: std::mem::take(&mut self.dest_acct),
                amount: self.amount,
            }));
        }
        if !self.src_acct.is_empty() || !self.dest_acct.is_empty() {
            return Err(MixedLegs);
        }
        Ok(Legs::MultiLeg {
            legs: std::mem::take(&mut self.legs),
            accounts: std::mem::take(&mut self.accounts),
            amount: self.amount,
        })
    }
}

impl Serialize for TransferDoc {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (src_acct, dest_acct, amount, legs, accounts) = stored_legs(&self.legs);
        StoredTransferRef {
            transaction_id: &self.transaction_id,
            src_acct,
            dest_acct,
            amount,
            legs,
            accounts,
            transaction_state: self.transaction_state,
            reason: self.reason,
            creation_time: self.creation_time,
            modification_time: self.modification_time,
            lease_owner: self.lease_owner.as_deref(),
            lease_expires_at: self.lease_expires_at,
            attention: self.attention.as_deref(),
            failed_account: self.failed_account.as_deref(),
            hold_expires_at: self.hold_expires_at,
            captured_amount: self.captured_amount,
            currency: self.currency.as_deref(),
            metadata: &self.metadata,
            history: &self.history,
            created_by: self.created_by.as_deref(),
            settled_by: self.settled_by.as_deref(),
            applied_marks: &self.applied_marks,
            traceparent: self.traceparent.as_deref(),
            entries: &self.entries,
        }
        .serialize(serializer)
    }
}

/// The stored fields of `legs`: `src_acct`, `dest_acct`, `amount`, `legs` and `accounts`, the
/// ones a one-leg transfer or a multi-leg one does not have empty (so not written).
fn stored_legs(legs: &Legs) -> (&str, &str, i64, &[Leg], &[String]) {
    match legs {
        Legs::OneLeg(leg) => (&leg.from, &leg.to, leg.amount, &[], &[]),
        Legs::MultiLeg {
            legs,
            accounts,
            amount,
        } => ("", "", *amount, legs, accounts),
    }
}
