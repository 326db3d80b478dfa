//! The transfer and its events as the API shows them (`GET /transfers/{id}`, `GET /events`,
//! webhooks): what the HTTP layer serializes and the dispatcher signs, built from the stored
//! document. Their OpenAPI schemas are derived here, with them.

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use super::feed::FeedEvent;
use super::model::{Leg, Legs, Metadata, RollbackReason, TransferDoc, TransferState};
use crate::time::{format_millis, Timestamp};

/// A transfer as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Transfer {
    pub id: String,
    /// Source account id of a one-leg transfer (absent on a multi-leg one: see `legs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::validated::AccountId>, nullable = false)]
    pub from: Option<String>,
    /// Destination account id of a one-leg transfer (absent on a multi-leg one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::validated::AccountId>, nullable = false)]
    pub to: Option<String>,
    /// Units a one-leg transfer moves (absent on a multi-leg one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1)]
    pub amount: Option<i64>,
    /// Every leg, always (one for a one-leg transfer, repeating `from`, `to` and `amount`).
    /// All apply or none.
    pub legs: Vec<Leg>,
    pub state: TransferState,
    /// Why it rolled back; present only in `terminating` and `rolled-back`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<RollbackReason>,
    /// With `reason`, when an account's apply was refused (`insufficient_funds`,
    /// `account_not_found`, `balance_overflow`, `account_busy`, `currency_mismatch`): that
    /// account. Its legs are the ones that caused the rollback.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::validated::AccountId>, nullable = false)]
    pub failed_account: Option<String>,
    /// When it was accepted: RFC 3339, UTC, millisecond precision.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// When it was last written (RFC 3339, UTC): a state change, or a worker taking it over.
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    /// Present when its documents contradict each other (only a lost acknowledged write in
    /// the store can do that): the service leaves it exactly as it is, for an operator.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attention: Option<String>,
    /// Present (`true`) only on a hold: it waits in `pending` for a capture, a cancel or its
    /// expiry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// A hold's expiry (RFC 3339, UTC): uncaptured then, it rolls back with `expired`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, nullable = false, format = DateTime)]
    pub hold_expires_at: Option<Timestamp>,
    /// A captured hold's units that move (the rest goes back to `from`); a multi-leg hold is
    /// captured whole: the sum of its legs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1)]
    pub captured_amount: Option<i64>,
    /// The currency the request stated; absent when it stated none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::validated::Currency>, nullable = false)]
    pub currency: Option<String>,
    /// Its labels, as given; absent when it has none.
    #[serde(skip_serializing_if = "Metadata::is_empty")]
    #[schema(value_type = Option<super::validated::Metadata>, nullable = false)]
    pub metadata: Metadata,
}

impl From<TransferDoc> for Transfer {
    fn from(doc: TransferDoc) -> Self {
        let (from, to, amount, legs) = match doc.legs {
            // A one-leg transfer shows its leg twice: as from/to/amount and as `legs`.
            Legs::OneLeg(leg) => (
                Some(leg.from.clone()),
                Some(leg.to.clone()),
                Some(leg.amount),
                vec![leg],
            ),
            Legs::MultiLeg { legs, .. } => (None, None, None, legs),
        };
        Self {
            id: doc.transaction_id,
            from,
            to,
            amount,
            legs,
            state: doc.transaction_state,
            reason: doc.reason,
            failed_account: doc.failed_account,
            created_at: doc.creation_time,
            updated_at: doc.modification_time,
            attention: doc.attention,
            hold: doc.hold_expires_at.is_some(),
            hold_expires_at: doc.hold_expires_at,
            captured_amount: doc.captured_amount,
            currency: doc.currency,
            metadata: doc.metadata,
        }
    }
}

/// One event: what happened to which transfer, and when.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Event {
    /// `<transfer id>/<type>`: the same every time this event is delivered; dedupe on it.
    #[schema(example = "t-1/transfer.finished")]
    pub id: String,
    /// `transfer.<state>` for each state the transfer reached (`transfer.created`,
    /// `transfer.pending`, `transfer.committed`, `transfer.finished`, `transfer.terminating`,
    /// `transfer.rolled-back`), or `transfer.captured` when a hold's capture was recorded.
    #[serde(rename = "type")]
    #[schema(example = "transfer.finished")]
    pub kind: &'static str,
    /// When the write that recorded it was made (RFC 3339, UTC, milliseconds).
    #[schema(example = "2026-11-24T07:30:00.000Z")]
    pub at: String,
    /// The transfer as it was when the event was read (it may be further along than `type`).
    pub transfer: Transfer,
}

impl Event {
    /// The events of a page, each transfer converted once however many events it has.
    pub fn from_feed(events: Vec<FeedEvent>) -> Vec<Event> {
        let mut last: Option<(Arc<TransferDoc>, Transfer)> = None;
        events
            .into_iter()
            .map(|event| {
                let transfer = match &last {
                    Some((doc, view)) if Arc::ptr_eq(doc, &event.transfer) => view.clone(),
                    _ => {
                        let view = Transfer::from(TransferDoc::clone(&event.transfer));
                        last = Some((event.transfer.clone(), view.clone()));
                        view
                    }
                };
                Event {
                    id: event.id,
                    kind: event.kind.type_name(),
                    at: format_millis(event.at),
                    transfer,
                }
            })
            .collect()
    }
}
