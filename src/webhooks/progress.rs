//! The durable progress of one receiver: `webhooks/{receiver id}`, holding the feed cursor
//! below which every selected event was delivered or given up, and the lease of the instance
//! delivering to it.
//!
//! Every write is conditional on the version last read or written (create-if-absent for the
//! first), so two instances cannot both hold the lease by a write: whoever writes second gets
//! a conflict and steps down. The lease's expiry is wall-clock time, read by other instances
//! to decide whether they may take over. That clock dependence is only for efficiency: if
//! clocks disagree (or a holder stalls past its expiry), two instances may deliver to the same
//! receiver for a while, which costs duplicate deliveries (same `webhook-id`), never a gap,
//! because the cursor only ever moves past events that were delivered or given up, and a
//! holder that lost the lease can no longer move it (its write conflicts).

use serde::{Deserialize, Serialize};

use crate::store::{
    format_millis, parse_millis, DynStore, Index, Source, StoreError, StoreResult, Version,
    WriteOutcome,
};
use crate::transfer::clock::DynClock;

/// The document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressDoc {
    /// The document id repeated (scans sort on it).
    pub receiver_id: String,
    /// The feed cursor (`FeedPosition::encode`) below which every selected event was
    /// delivered or given up; absent: from the start of the feed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// The instance delivering to this receiver; absent when released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    /// When the lease runs out (RFC 3339): after it, another instance may take over.
    pub lease_expires: String,
    pub modification_time: String,
}

/// What [`Progress::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This instance holds the lease; deliver from `cursor`.
    Held { cursor: Option<String> },
    /// Another instance holds it until this time (epoch milliseconds).
    Busy { until: i64 },
}

/// One instance's handle on one receiver's progress document.
pub struct Progress {
    store: DynStore,
    clock: DynClock,
    receiver_id: String,
    owner: String,
    lease_millis: i64,
    /// The version of our last write while we hold the lease.
    held: Option<Version>,
    expires: i64,
}

impl Progress {
    pub fn new(
        store: DynStore,
        clock: DynClock,
        receiver_id: String,
        lease: std::time::Duration,
    ) -> Self {
        Self {
            store,
            clock,
            receiver_id,
            owner: uuid::Uuid::new_v4().simple().to_string(),
            lease_millis: lease.as_millis().max(1) as i64,
            held: None,
            expires: 0,
        }
    }

    /// This instance's owner token.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether we hold the lease (by our last write) and, by our clock, it has not run out.
    pub fn holds(&self) -> bool {
        self.held.is_some() && self.clock.wall_millis() < self.expires
    }

    fn doc(
        &self,
        cursor: Option<String>,
        owner: Option<String>,
        expires: i64,
    ) -> StoreResult<Source> {
        let doc = ProgressDoc {
            receiver_id: self.receiver_id.clone(),
            cursor,
            lease_owner: owner,
            lease_expires: format_millis(expires),
            modification_time: format_millis(self.clock.wall_millis()),
        };
        Source::encode(&doc).map_err(|e| StoreError::Permanent(format!("webhook progress: {e}")))
    }

    /// Takes the lease if it is free, ours, or expired; says who holds it otherwise.
    pub async fn claim(&mut self) -> StoreResult<Claim> {
        self.held = None;
        let now = self.clock.wall_millis();
        let expires = now + self.lease_millis;
        let Some(current) = self.store.get(Index::Webhooks, &self.receiver_id).await? else {
            let source = self.doc(None, Some(self.owner.clone()), expires)?;
            return match self
                .store
                .create(Index::Webhooks, &self.receiver_id, source)
                .await?
            {
                WriteOutcome::Written(version) => {
                    self.held = Some(version);
                    self.expires = expires;
                    Ok(Claim::Held { cursor: None })
                }
                // Another instance created it first: look again.
                _ => Ok(Claim::Busy { until: now }),
            };
        };
        let doc: ProgressDoc = current.source.decode().map_err(|e| {
            StoreError::Permanent(format!("webhook progress {}: {e}", self.receiver_id))
        })?;
        let until = parse_millis(&doc.lease_expires).unwrap_or(0);
        let free = doc.lease_owner.is_none()
            || doc.lease_owner.as_deref() == Some(self.owner.as_str())
            || until <= now;
        if !free {
            return Ok(Claim::Busy { until });
        }
        let source = self.doc(doc.cursor.clone(), Some(self.owner.clone()), expires)?;
        match self
            .store
            .replace_if(Index::Webhooks, &self.receiver_id, source, current.version)
            .await?
        {
            WriteOutcome::Written(version) => {
                self.held = Some(version);
                self.expires = expires;
                Ok(Claim::Held { cursor: doc.cursor })
            }
            _ => Ok(Claim::Busy { until: now }),
        }
    }

    /// Saves `cursor` and renews the lease. `Ok(false)`: the lease is lost (someone took it
    /// over; the write changed nothing). An error leaves the outcome unknown: the next save
    /// tells.
    pub async fn save(&mut self, cursor: Option<String>) -> StoreResult<bool> {
        let Some(version) = self.held else {
            return Ok(false);
        };
        let expires = self.clock.wall_millis() + self.lease_millis;
        let source = self.doc(cursor, Some(self.owner.clone()), expires)?;
        match self
            .store
            .replace_if(Index::Webhooks, &self.receiver_id, source, version)
            .await?
        {
            WriteOutcome::Written(version) => {
                self.held = Some(version);
                self.expires = expires;
                Ok(true)
            }
            _ => {
                self.held = None;
                Ok(false)
            }
        }
    }

    /// Saves `cursor` and gives the lease up, so another instance takes over at once.
    pub async fn release(&mut self, cursor: Option<String>) -> StoreResult<()> {
        let Some(version) = self.held.take() else {
            return Ok(());
        };
        let now = self.clock.wall_millis();
        let source = self.doc(cursor, None, now)?;
        self.store
            .replace_if(Index::Webhooks, &self.receiver_id, source, version)
            .await?;
        Ok(())
    }

    /// The lease's expiry by our last write (epoch milliseconds).
    pub fn expires(&self) -> i64 {
        self.expires
    }
}
