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

use crate::store::{DynStore, Index, Source, StoreError, StoreResult, Version, WriteOutcome};
use crate::time::{format_millis, parse_millis};
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
pub enum ProgressClaim {
    /// This instance holds the lease; deliver from `cursor`.
    Leased { cursor: Option<String> },
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
    /// The cursor a progress document is created with (the start of a URL seen for the
    /// first time).
    initial: Option<String>,
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
            initial: None,
        }
    }

    /// Creates the document, if this instance is the first to, at `cursor` instead of the
    /// beginning of the feed.
    pub fn starting_at(mut self, cursor: Option<String>) -> Self {
        self.initial = cursor;
        self
    }

    /// This instance's owner token.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether we hold the lease (by our last write) and, by our clock, it has not run out.
    pub fn holds(&self) -> bool {
        self.held.is_some() && self.clock.wall_millis() < self.expires
    }

    /// Until when (wall millis) this instance may send deliveries: a skew margin before the
    /// lease it holds runs out, as another instance takes over only a margin after (so the
    /// two never deliver at once while clocks differ by less than the margin); 0 when it
    /// holds none.
    pub fn deliver_until(&self) -> i64 {
        match self.held {
            Some(_) => self.expires - self.lease_millis / 4,
            None => 0,
        }
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
    pub async fn claim(&mut self) -> StoreResult<ProgressClaim> {
        self.held = None;
        let now = self.clock.wall_millis();
        let expires = now + self.lease_millis;
        let Some(current) = self.store.get(Index::Webhooks, &self.receiver_id).await? else {
            let source = self.doc(self.initial.clone(), Some(self.owner.clone()), expires)?;
            return match self
                .store
                .create(Index::Webhooks, &self.receiver_id, source)
                .await?
            {
                WriteOutcome::Written(version) => {
                    self.held = Some(version);
                    self.expires = expires;
                    Ok(ProgressClaim::Leased {
                        cursor: self.initial.clone(),
                    })
                }
                // Another instance created it first: look again.
                _ => Ok(ProgressClaim::Busy { until: now }),
            };
        };
        let doc: ProgressDoc = current.source.decode().map_err(|e| {
            StoreError::Permanent(format!("webhook progress {}: {e}", self.receiver_id))
        })?;
        let until = parse_millis(&doc.lease_expires).unwrap_or(0);
        // Another holder's lease is taken over only a skew margin (a quarter of the lease, as
        // for transfers, `docs/design.md §9`) after its expiry on this clock, so that a holder
        // whose clock is behind ours is not overlapped while it still believes it holds it.
        let margin = self.lease_millis / 4;
        let free = doc.lease_owner.is_none()
            || doc.lease_owner.as_deref() == Some(self.owner.as_str())
            || until + margin <= now;
        if !free {
            return Ok(ProgressClaim::Busy { until });
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
                Ok(ProgressClaim::Leased { cursor: doc.cursor })
            }
            _ => Ok(ProgressClaim::Busy { until: now }),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::transfer::clock::{Clock, TestClock};

    const LEASE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn one_holder_at_a_time_and_a_holder_that_lost_the_lease_cannot_move_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        let clock = TestClock::new();
        let other_clock = clock.skewed(0);
        let mut a = Progress::new(store.clone(), clock.clone(), "r1".into(), LEASE);
        let mut b = Progress::new(store.clone(), other_clock.clone(), "r1".into(), LEASE);

        assert_eq!(
            a.claim().await.unwrap(),
            ProgressClaim::Leased { cursor: None }
        );
        // a delivers until a skew margin (7.5 s) before its lease runs out.
        let until = a.deliver_until() - clock.wall_millis();
        assert!((22_000..=22_500).contains(&until), "{until}");
        assert!(
            matches!(b.claim().await.unwrap(), ProgressClaim::Busy { until } if until >= clock.wall_millis() + 29_000)
        );
        assert!(a.save(Some("7".into())).await.unwrap());
        assert!(a.holds());

        // Just past a's expiry on b's clock, b still waits the skew margin (7.5 s)...
        other_clock.set_skew_millis(31_000);
        assert!(matches!(
            b.claim().await.unwrap(),
            ProgressClaim::Busy { .. }
        ));
        // ...and after it (a stalled, or the clocks disagree by more than the margin) b takes
        // over from the saved cursor.
        other_clock.set_skew_millis(38_000);
        assert_eq!(
            b.claim().await.unwrap(),
            ProgressClaim::Leased {
                cursor: Some("7".into())
            }
        );
        // a's next write conflicts: it can no longer move the cursor, and knows it lost.
        assert!(!a.save(Some("9".into())).await.unwrap());
        assert!(!a.holds());
        assert_eq!(a.deliver_until(), 0, "a lost lease sends nothing more");
        let doc: ProgressDoc = store
            .get(Index::Webhooks, "r1")
            .await
            .unwrap()
            .unwrap()
            .source
            .decode()
            .unwrap();
        assert_eq!(doc.cursor.as_deref(), Some("7"));
        assert_eq!(doc.lease_owner.as_deref(), Some(b.owner()));

        // A release hands the lease over at once, with the cursor.
        assert!(b.save(Some("8".into())).await.unwrap());
        b.release(Some("8".into())).await.unwrap();
        assert_eq!(
            a.claim().await.unwrap(),
            ProgressClaim::Leased {
                cursor: Some("8".into())
            }
        );
        // Back in step, b sees a's lease as running (ahead by 38 s, it would take it again:
        // the clock dependence, which costs duplicates).
        other_clock.set_skew_millis(0);
        assert!(matches!(
            b.claim().await.unwrap(),
            ProgressClaim::Busy { .. }
        ));
    }

    #[tokio::test]
    async fn receivers_have_documents_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        let clock = TestClock::new();
        let mut one = Progress::new(store.clone(), clock.clone(), "r1".into(), LEASE);
        let mut two = Progress::new(store.clone(), clock.clone(), "r2".into(), LEASE);
        assert_eq!(
            one.claim().await.unwrap(),
            ProgressClaim::Leased { cursor: None }
        );
        assert_eq!(
            two.claim().await.unwrap(),
            ProgressClaim::Leased { cursor: None }
        );
        assert!(one.save(Some("3".into())).await.unwrap());
        let doc = store.get(Index::Webhooks, "r2").await.unwrap().unwrap();
        assert_eq!(doc.source.decode::<ProgressDoc>().unwrap().cursor, None);
    }
}
