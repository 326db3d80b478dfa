//! The requests the engine takes, validated: opening an account and creating a transfer. A
//! [`NewTransfer`] cannot hold an invalid combination: it moves one leg or several
//! ([`Movement`], whose only constructors check the legs), and only a hold has an expiry
//! ([`Hold`]).

use std::time::Duration;

use super::clock::Now;
use super::model::{AccountDoc, Leg, Legs, Metadata, Tombstones, TransferDoc};
use super::validated::{AccountId, Currency, PositiveAmount, TransferId};
use crate::trace_context;

/// `with_currency` and `with_metadata` of a request (`$kind`) that states a currency and
/// labels, in fields of those names.
macro_rules! currency_and_labels {
    ($request:ty, $kind:literal) => {
        impl $request {
            #[doc = concat!("The same request with the ", $kind, "'s currency (`None`: none).")]
            pub fn with_currency(mut self, currency: Option<Currency>) -> Self {
                self.currency = currency;
                self
            }

            #[doc = concat!("The same request with the ", $kind, "'s labels.")]
            pub fn with_metadata(mut self, metadata: Metadata) -> Self {
                self.metadata = metadata;
                self
            }
        }
    };
}

currency_and_labels!(NewAccount, "account");
currency_and_labels!(NewTransfer, "transfer");

/// The request to open an account: its balance never below its floor (the only
/// constructors, [`NewAccount::new`] and [`NewAccount::open`], refuse it).
#[derive(Debug, Clone)]
pub struct NewAccount {
    id: AccountId,
    balance: i64,
    floor: i64,
    /// Fixed for the account's life.
    currency: Option<Currency>,
    /// Labels ([`super::validated::valid_metadata`]).
    metadata: Metadata,
}

/// An opening balance below the account's floor: such an account would break its own floor
/// from its first moment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`balance` ({balance}) must not be below `floor` ({floor})")]
pub struct BalanceBelowFloor {
    pub balance: i64,
    pub floor: i64,
}

impl NewAccount {
    /// An account opened with `balance`, floor 0, no currency and no labels.
    pub fn new(id: AccountId, balance: i64) -> Result<Self, BalanceBelowFloor> {
        Self::open(id, balance, 0)
    }

    /// An account opened with `balance` and `floor` (the lowest balance a debit may leave),
    /// no currency and no labels.
    pub fn open(id: AccountId, balance: i64, floor: i64) -> Result<Self, BalanceBelowFloor> {
        if balance < floor {
            return Err(BalanceBelowFloor { balance, floor });
        }
        Ok(Self {
            id,
            balance,
            floor,
            currency: None,
            metadata: Metadata::default(),
        })
    }

    pub fn id(&self) -> &AccountId {
        &self.id
    }

    /// The account as stored when it opens at `now`, created by the request carrying
    /// `token` (`created_by`): its opening balance is its balance, nothing pending.
    pub fn document(&self, now: &Now, token: String) -> AccountDoc {
        debug_assert!(self.balance >= self.floor, "checked when built");
        AccountDoc {
            account_id: self.id.to_string(),
            balance: self.balance,
            floor: self.floor,
            opening_balance: self.balance,
            created_by: Some(token),
            currency: self.currency.clone().map(String::from),
            metadata: self.metadata.clone(),
            pending_transactions: Vec::new(),
            pending_applied_at: Vec::new(),
            pending_marks: Vec::new(),
            pending_credits: 0,
            pending_debits: 0,
            settled: Tombstones::default(),
            legacy_settled: Vec::new(),
            entry_from: 1,
            entry_seq: 0,
            entry_at: 0,
            pending_entries: Vec::new(),
            unfiled: Vec::new(),
            creation_time: now.text.clone(),
            modification_time: now.text.clone(),
        }
    }

    /// Whether `existing`, stored under this request's id, was opened by the same request
    /// (then a create is a replay; otherwise a conflict).
    pub fn is_replay_of(&self, existing: &AccountDoc) -> bool {
        existing.opening_balance == self.balance
            && existing.floor == self.floor
            && existing.currency.as_deref() == self.currency.as_deref().map(String::as_str)
            && existing.metadata == self.metadata
    }
}

/// A validated transfer request: its parts are validated values, and its fields private, so
/// that it holds only what its constructors and the API's body (`TryFrom<CreateTransfer>` in
/// `crate::http::transfers`) admit.
#[derive(Debug, Clone)]
pub struct NewTransfer {
    id: TransferId,
    /// What it moves.
    movement: Movement,
    /// `Some`: a hold, driven to `pending` and left there for a capture, a cancel or its
    /// expiry.
    hold: Option<Hold>,
    /// The currency the client states, if any.
    currency: Option<Currency>,
    /// Labels ([`super::validated::valid_metadata`]).
    metadata: Metadata,
}

/// A hold's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// How long it waits for its capture; `None`: the service's `HOLD_TIMEOUT`. The API
    /// takes it within [`super::validated::MIN_HOLD`]..=[`super::validated::MAX_HOLD`]
    /// ([`super::validated::HoldExpiry`]); the engine holds for any duration (its tests scale
    /// time down).
    pub expires_in: Option<Duration>,
}

/// The most legs one transaction has.
pub const MAX_LEGS: usize = 16;

/// One leg as a client asks for it: `amount` units from one account to another, each part
/// a validated value. That the two accounts differ is the rule of the [`Movement`] it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLeg {
    from: AccountId,
    to: AccountId,
    amount: PositiveAmount,
}

impl NewLeg {
    pub fn new(from: AccountId, to: AccountId, amount: PositiveAmount) -> Self {
        Self { from, to, amount }
    }
}

impl From<NewLeg> for Leg {
    fn from(leg: NewLeg) -> Self {
        Leg {
            from: leg.from.into(),
            to: leg.to.into(),
            amount: leg.amount.get(),
        }
    }
}

/// Legs that make no [`Movement`], and why: the message the API answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidLegs(String);

/// What a transfer moves: 1 to [`MAX_LEGS`] legs, each from one account to another and of
/// at least one unit, their amounts summing to at most 2^63−1. One leg is a one-leg transfer,
/// stored exactly as one made before legs existed (`src_acct`, `dest_acct`, `amount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Movement {
    legs: Vec<Leg>,
    total: i64,
}

impl Movement {
    /// `amount` units from `from` to `to`; `Err` says why not (the same account twice, an
    /// amount below 1).
    pub fn one_leg(from: AccountId, to: AccountId, amount: i64) -> Result<Self, String> {
        let amount = PositiveAmount::new(amount).ok_or("`amount` must be positive")?;
        Self::one(NewLeg::new(from, to, amount))
    }

    /// One leg; `Err` if it is from an account to itself.
    pub fn one(leg: NewLeg) -> Result<Self, String> {
        if leg.from == leg.to {
            return Err("`from` and `to` must differ".into());
        }
        let total = leg.amount.get();
        Ok(Self {
            legs: vec![leg.into()],
            total,
        })
    }

    /// The legs of a transaction as `legs` yields them, each parsed by whoever gives it (an
    /// `Err` is passed on as it is): 1 to [`MAX_LEGS`] (counted before any is read), each
    /// from one account to another, the amounts summing to at most 2^63−1. A refusal names
    /// the leg.
    pub fn of_legs<E: From<InvalidLegs>>(
        legs: impl ExactSizeIterator<Item = Result<NewLeg, E>>,
    ) -> Result<Self, E> {
        if legs.len() == 0 || legs.len() > MAX_LEGS {
            return Err(InvalidLegs(format!(
                "`legs` must hold 1 to {MAX_LEGS} legs, not {}",
                legs.len()
            ))
            .into());
        }
        let legs = legs.collect::<Result<Vec<NewLeg>, E>>()?;
        let mut total: i64 = 0;
        for (i, leg) in legs.iter().enumerate() {
            if leg.from == leg.to {
                let same = format!("`legs[{i}].from` and `legs[{i}].to` must differ");
                return Err(InvalidLegs(same).into());
            }
            total = total.checked_add(leg.amount.get()).ok_or_else(|| {
                InvalidLegs("the amounts of `legs` must sum to at most 9223372036854775807".into())
            })?;
        }
        let legs = legs.into_iter().map(Leg::from).collect();
        Ok(Self { legs, total })
    }

    /// The legs of a transaction as stored (or written by hand), parsed: 1 to [`MAX_LEGS`],
    /// each with valid ids, `from` ≠ `to` and an amount of at least 1, the amounts summing to
    /// at most 2^63−1. `Err` says which leg is wrong and why.
    ///
    /// ```
    /// use transfer_service::transfer::model::Leg;
    /// use transfer_service::transfer::requests::Movement;
    /// let leg = |from: &str, to: &str, amount| Leg { from: from.into(), to: to.into(), amount };
    /// assert_eq!(Movement::legs(vec![leg("a", "b", 2), leg("a", "c", 3)]).unwrap().amount(), 5);
    /// assert!(Movement::legs(vec![]).is_err());
    /// assert!(Movement::legs(vec![leg("a", "a", 1)]).is_err());
    /// assert!(Movement::legs(vec![leg("a", "b", 0)]).is_err());
    /// assert!(Movement::legs(vec![leg("a", "b", i64::MAX), leg("a", "c", 1)]).is_err());
    /// ```
    pub fn legs(legs: Vec<Leg>) -> Result<Self, String> {
        let parsed = legs.into_iter().enumerate().map(|(i, leg)| {
            let (Some(from), Some(to)) = (AccountId::parse(leg.from), AccountId::parse(leg.to))
            else {
                return Err(InvalidLegs(format!(
                    "`legs[{i}]` names an invalid account id"
                )));
            };
            let amount = PositiveAmount::new(leg.amount)
                .ok_or_else(|| InvalidLegs(format!("`legs[{i}].amount` must be positive")))?;
            Ok(NewLeg::new(from, to, amount))
        });
        Self::of_legs(parsed).map_err(|InvalidLegs(why)| why)
    }

    /// The units it moves: the sum of its legs.
    pub fn amount(&self) -> i64 {
        self.total
    }

    /// Its legs (one for a one-leg transfer).
    pub fn leg_list(&self) -> &[Leg] {
        &self.legs
    }

    /// How a transfer document holds it: one leg, or several with their sum and accounts.
    fn stored(&self) -> Legs {
        match self.legs.as_slice() {
            [one] => Legs::OneLeg(one.clone()),
            several => Legs::multi_leg(several.to_vec(), self.total),
        }
    }

    /// Whether `stored` moves what this does: the same one leg, or the same legs in the same
    /// order and their sum (the accounts follow from the legs).
    fn is_stored_as(&self, stored: &Legs) -> bool {
        match (stored, self.legs.as_slice()) {
            (Legs::OneLeg(leg), [one]) => leg == one,
            (Legs::MultiLeg { legs, amount, .. }, several) => {
                several.len() > 1 && legs == several && *amount == self.total
            }
            _ => false,
        }
    }
}

impl NewTransfer {
    /// A transfer of `movement`: not a hold, no stated currency, no labels.
    pub fn new(id: TransferId, movement: Movement) -> Self {
        Self {
            id,
            movement,
            hold: None,
            currency: None,
            metadata: Metadata::default(),
        }
    }

    /// The same request under another id.
    pub fn with_id(mut self, id: TransferId) -> Self {
        self.id = id;
        self
    }

    /// The same request as a hold with these terms (`None`: not a hold).
    pub fn with_hold(mut self, hold: Option<Hold>) -> Self {
        self.hold = hold;
        self
    }

    pub fn id(&self) -> &TransferId {
        &self.id
    }

    pub fn movement(&self) -> &Movement {
        &self.movement
    }

    pub fn hold(&self) -> Option<Hold> {
        self.hold
    }

    pub fn currency(&self) -> Option<&Currency> {
        self.currency.as_ref()
    }

    /// The document this request creates at `now`: `created`, a hold expiring after its own
    /// `hold_expires_in` or else `hold_timeout`, a multi-leg transaction listing its accounts.
    pub fn document(&self, now: &Now, hold_timeout: Duration) -> TransferDoc {
        TransferDoc {
            hold_expires_at: self
                .hold_millis(hold_timeout)
                .map(|millis| now.timestamp().plus_millis(millis)),
            currency: self.currency.clone().map(String::from),
            metadata: self.metadata.clone(),
            // The creating request's span: the transfer's later spans join its trace.
            traceparent: trace_context::current_traceparent(),
            ..TransferDoc::created_moving(&self.id, self.movement.stored(), now.timestamp())
        }
    }

    /// Whether `existing`, stored under this request's id, is what this request would have
    /// stored (then a create is a replay; otherwise a conflict). Holds compare by duration:
    /// the stored expiry is the creation time plus it, to the millisecond.
    pub fn is_replay_of(&self, existing: &TransferDoc, hold_timeout: Duration) -> bool {
        let same_hold = match (&existing.hold_expires_at, self.hold_millis(hold_timeout)) {
            (None, None) => true,
            (Some(expires), Some(millis)) => {
                expires.millis() - existing.creation_time.millis() == millis
            }
            _ => false,
        };
        self.movement.is_stored_as(&existing.legs)
            && same_hold
            && existing.currency.as_deref() == self.currency.as_deref().map(String::as_str)
            && existing.metadata == self.metadata
    }

    /// How long a hold waits, in milliseconds; `None` for a plain transfer.
    fn hold_millis(&self, hold_timeout: Duration) -> Option<i64> {
        let hold = self.hold?;
        let expires_in = hold.expires_in.unwrap_or(hold_timeout);
        Some(expires_in.as_millis() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_cannot_be_opened_below_its_floor() {
        let id = || AccountId::parse("a".into()).expect("a valid id");
        assert_eq!(
            NewAccount::open(id(), 10, 20).unwrap_err(),
            BalanceBelowFloor {
                balance: 10,
                floor: 20
            }
        );
        assert!(NewAccount::new(id(), -1).is_err(), "floor 0");
        let at_the_floor = NewAccount::open(id(), -5, -5).expect("at the floor");
        let now = Now {
            millis: 0,
            text: "1970-01-01T00:00:00.000Z".into(),
        };
        let opened = at_the_floor.document(&now, "token".into());
        assert_eq!(
            (opened.balance, opened.floor, opened.opening_balance),
            (-5, -5, -5)
        );
    }

    #[test]
    fn legs_are_checked_one_by_one_and_their_sum_must_fit() {
        let check_legs = |legs: &[Leg]| Movement::legs(legs.to_vec()).map(|m| m.amount());
        let leg = |f: &str, t: &str, a| Leg {
            from: f.into(),
            to: t.into(),
            amount: a,
        };
        assert_eq!(check_legs(&[leg("a", "b", 1)]), Ok(1));
        assert_eq!(check_legs(&vec![leg("a", "b", 1); 16]), Ok(16));
        assert!(check_legs(&vec![leg("a", "b", 1); 17])
            .unwrap_err()
            .contains("1 to 16"));
        assert!(check_legs(&[]).unwrap_err().contains("1 to 16"));
        assert!(check_legs(&[leg("a", "b", 1), leg("c", "c", 1)])
            .unwrap_err()
            .contains("legs[1].from"));
        assert!(check_legs(&[leg("a", "b", 0)])
            .unwrap_err()
            .contains("legs[0].amount"));
        assert!(check_legs(&[leg("a", "b", i64::MAX), leg("b", "a", 1)])
            .unwrap_err()
            .contains("sum"));
    }
}
