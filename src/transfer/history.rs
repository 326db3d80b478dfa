//! The outbox of the change feed (`docs/design.md §11`): each transfer document records its
//! own transitions in `history`, appended in the same conditional write as the transition,
//! so an event exists exactly when its transition was written.
//!
//! Form: `<code><epoch ms>` per transition, space-separated, oldest first. `created` is not
//! recorded (it is `creation_time`). Codes: `p` pending, `m` committed, `f` finished,
//! `t` terminating, `r` rolled-back, `c` captured (a hold's capture was recorded).

use super::model::{TransferDoc, TransferState};

/// What an event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    State(TransferState),
    Captured,
}

impl EventKind {
    /// `transfer.<state>` or `transfer.captured`.
    pub fn type_name(self) -> &'static str {
        match self {
            EventKind::State(TransferState::Created) => "transfer.created",
            EventKind::State(TransferState::Pending) => "transfer.pending",
            EventKind::State(TransferState::Committed) => "transfer.committed",
            EventKind::State(TransferState::Finished) => "transfer.finished",
            EventKind::State(TransferState::Terminating) => "transfer.terminating",
            EventKind::State(TransferState::RolledBack) => "transfer.rolled-back",
            EventKind::Captured => "transfer.captured",
        }
    }

    fn code(self) -> Option<char> {
        Some(match self {
            EventKind::State(TransferState::Created) => return None,
            EventKind::State(TransferState::Pending) => 'p',
            EventKind::State(TransferState::Committed) => 'm',
            EventKind::State(TransferState::Finished) => 'f',
            EventKind::State(TransferState::Terminating) => 't',
            EventKind::State(TransferState::RolledBack) => 'r',
            EventKind::Captured => 'c',
        })
    }

    fn from_code(code: char) -> Option<Self> {
        Some(match code {
            'p' => EventKind::State(TransferState::Pending),
            'm' => EventKind::State(TransferState::Committed),
            'f' => EventKind::State(TransferState::Finished),
            't' => EventKind::State(TransferState::Terminating),
            'r' => EventKind::State(TransferState::RolledBack),
            'c' => EventKind::Captured,
            _ => return None,
        })
    }
}

/// One event of a transfer, as derived from its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub kind: EventKind,
    /// Epoch milliseconds of the write that recorded it.
    pub at: i64,
}

impl HistoryEntry {
    /// The event's id, the same however often it is delivered: `<transfer id>/<type>` (a
    /// state is reached at most once, a capture recorded once).
    pub fn id(&self, transfer_id: &str) -> String {
        format!("{transfer_id}/{}", self.kind.type_name())
    }
}

impl TransferDoc {
    /// Appends to `history` what this document is about to be written with and the history
    /// does not record yet: a recorded capture, then the state. Stateless and idempotent:
    /// calling it on a document whose history is complete changes nothing, so every
    /// transfer write may call it (`src/transfer/lease.rs` does, before each).
    pub fn note_transitions(&mut self, now_millis: i64) {
        if self.captured_amount.is_some() && !self.history_has('c') {
            self.push_history('c', now_millis);
        }
        let state = EventKind::State(self.transaction_state);
        if let Some(code) = state.code() {
            if self.last_state_code() != Some(code) {
                self.push_history(code, now_millis);
            }
        }
    }

    /// Every event this document records, oldest first: `created` (at `creation_time`),
    /// then its history. An entry that does not parse is skipped.
    pub fn events(&self) -> Vec<HistoryEntry> {
        let created = self.creation_time.millis();
        let mut events = vec![HistoryEntry {
            kind: EventKind::State(TransferState::Created),
            at: created,
        }];
        events.extend(self.history.split(' ').filter_map(|entry| {
            let mut chars = entry.chars();
            let kind = EventKind::from_code(chars.next()?)?;
            let at = chars.as_str().parse().ok()?;
            Some(HistoryEntry { kind, at })
        }));
        events
    }

    fn history_has(&self, code: char) -> bool {
        self.history.split(' ').any(|entry| entry.starts_with(code))
    }

    fn last_state_code(&self) -> Option<char> {
        self.history
            .split(' ')
            .rev()
            .filter_map(|entry| entry.chars().next())
            .find(|&code| code != 'c')
    }

    fn push_history(&mut self, code: char, now_millis: i64) {
        use std::fmt::Write;
        if !self.history.is_empty() {
            self.history.push(' ');
        }
        let _ = write!(self.history, "{code}{now_millis}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::format_millis;

    fn doc() -> TransferDoc {
        serde_json::from_value(serde_json::json!({
            "transaction_id": "t1", "src_acct": "a", "dest_acct": "b", "amount": 5,
            "transaction_state": "created",
            "creation_time": format_millis(1_000), "modification_time": format_millis(1_000),
        }))
        .unwrap()
    }

    fn types(doc: &TransferDoc) -> Vec<(&'static str, i64)> {
        doc.events()
            .iter()
            .map(|e| (e.kind.type_name(), e.at))
            .collect()
    }

    #[test]
    fn a_created_transfer_has_one_event_and_writes_no_history() {
        let mut d = doc();
        d.note_transitions(5);
        assert_eq!(d.history, "");
        assert_eq!(types(&d), [("transfer.created", 1_000)]);
        let json = serde_json::to_value(&d).unwrap();
        assert!(json.get("history").is_none(), "{json}");
    }

    #[test]
    fn every_state_is_recorded_once_in_order() {
        let mut d = doc();
        for (state, at) in [
            (TransferState::Pending, 2_000),
            (TransferState::Committed, 3_000),
            (TransferState::Finished, 4_000),
        ] {
            d.transaction_state = state;
            d.note_transitions(at);
            // A second write in the same state (a renewal, a retry) records nothing.
            d.note_transitions(at + 1);
        }
        assert_eq!(d.history, "p2000 m3000 f4000");
        assert_eq!(
            types(&d),
            [
                ("transfer.created", 1_000),
                ("transfer.pending", 2_000),
                ("transfer.committed", 3_000),
                ("transfer.finished", 4_000)
            ]
        );
        assert_eq!(d.events()[3].id("t1"), "t1/transfer.finished");
    }

    #[test]
    fn a_capture_comes_before_the_commit_and_once() {
        let mut d = doc();
        d.transaction_state = TransferState::Pending;
        d.note_transitions(2_000);
        d.captured_amount = Some(3);
        d.note_transitions(2_500);
        d.transaction_state = TransferState::Committed;
        d.note_transitions(3_000);
        d.transaction_state = TransferState::Finished;
        d.note_transitions(4_000);
        assert_eq!(d.history, "p2000 c2500 m3000 f4000");
        // Captured and committed in one write: still capture first.
        let mut e = doc();
        e.transaction_state = TransferState::Pending;
        e.note_transitions(2_000);
        e.captured_amount = Some(3);
        e.transaction_state = TransferState::Committed;
        e.note_transitions(3_000);
        assert_eq!(e.history, "p2000 c3000 m3000");
    }

    #[test]
    fn rollbacks_record_their_path() {
        let mut direct = doc();
        direct.transaction_state = TransferState::RolledBack;
        direct.note_transitions(2_000);
        assert_eq!(direct.history, "r2000");
        let mut undone = doc();
        for (state, at) in [
            (TransferState::Pending, 2_000),
            (TransferState::Terminating, 3_000),
            (TransferState::RolledBack, 4_000),
        ] {
            undone.transaction_state = state;
            undone.note_transitions(at);
        }
        assert_eq!(
            types(&undone).iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [
                "transfer.created",
                "transfer.pending",
                "transfer.terminating",
                "transfer.rolled-back"
            ]
        );
    }
}
