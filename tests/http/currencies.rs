//! Currencies over HTTP (docs/design.md §5): an account's `currency`, fixed at creation and
//! part of its create's replay comparison; a transfer's optional `currency`; a transfer
//! between currencies rolls back with `currency_mismatch` and moves nothing. Run on the
//! embedded store, the Elasticsearch backend on the emulator (a test double of
//! Elasticsearch) and a real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use serde_json::{json, Value};

use crate::support::app::{Backend, TestApp};
use crate::support::problems::assert_422_saying;

mod cases {
    use super::*;

    pub async fn an_accounts_currency_is_shown_fixed_and_compared_on_replay(b: Backend) {
        let app = TestApp::spawn(b).await;
        let usd = json!({"id": "u", "balance": 100, "currency": "USD"});
        let (status, body) = app.post("/accounts", usd.clone()).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["currency"], "USD", "{body}");
        let (status, body) = app.get("/accounts/u").await;
        assert_eq!((status, &body["currency"]), (200, &json!("USD")), "{body}");
        let (status, body) = app.post("/accounts", usd.clone()).await;
        assert_eq!(status, 200, "identical replay: {body}");
        app.assert_account_replays_conflict(&usd, "currency", &[json!("EUR"), Value::Null])
            .await;
        // An account without a currency shows none, and a replay stating one conflicts.
        app.open_account("plain", 5).await;
        let (_, body) = app.get("/accounts/plain").await;
        assert!(body.get("currency").is_none(), "{body}");
        let (status, body) = app
            .post(
                "/accounts",
                json!({"id": "plain", "balance": 5, "currency": "USD"}),
            )
            .await;
        assert_eq!(status, 409, "{body}");
    }

    pub async fn invalid_currencies_are_422_saying_why(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 10), ("b", 0)]).await;
        let long = "A".repeat(17);
        for bad in [
            json!("usd"),
            json!(""),
            json!(long),
            json!("US D"),
            json!("€"),
            json!(840),
            json!(["USD"]),
        ] {
            let (status, body) = app
                .post(
                    "/accounts",
                    json!({"id": "x", "balance": 1, "currency": bad}),
                )
                .await;
            assert_422_saying(status, &body, "`currency` must be 1–16 characters");
            let (status, body) = app
                .post(
                    "/transfers",
                    json!({"from": "a", "to": "b", "amount": 1, "currency": bad}),
                )
                .await;
            assert_422_saying(status, &body, "`currency` must be 1–16 characters");
        }
        assert_eq!(app.status("/accounts/x").await, 404);
    }

    pub async fn a_transfer_between_currencies_rolls_back_with_currency_mismatch(b: Backend) {
        let app = TestApp::spawn(b).await;
        for (id, currency) in [
            ("usd1", json!("USD")),
            ("usd2", json!("USD")),
            ("eur", json!("EUR")),
        ] {
            let (status, body) = app
                .post(
                    "/accounts",
                    json!({"id": id, "balance": 100, "currency": currency}),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
        app.open_account("plain", 100).await;
        // (id, from, to, stated currency, finishes)
        let cases = [
            ("same", "usd1", "usd2", Value::Null, true),
            ("same-stated", "usd2", "usd1", json!("USD"), true),
            ("usd-eur", "usd1", "eur", Value::Null, false),
            ("plain-usd", "plain", "usd1", Value::Null, false),
            ("stated-other", "usd1", "usd2", json!("EUR"), false),
        ];
        for (id, from, to, currency, _) in &cases {
            let mut body = json!({"id": id, "from": from, "to": to, "amount": 10});
            if !currency.is_null() {
                body["currency"] = currency.clone();
            }
            let (status, created) = app.post("/transfers", body).await;
            assert_eq!(status, 201, "{created}");
            assert_eq!(
                created.get("currency"),
                (!currency.is_null()).then_some(currency)
            );
        }
        for (id, _, _, _, finishes) in &cases {
            let settled = app.settled(id).await;
            if *finishes {
                assert_eq!(settled["state"], "finished", "{settled}");
            } else {
                assert_eq!(settled["state"], "rolled-back", "{settled}");
                assert_eq!(settled["reason"], "currency_mismatch", "{settled}");
            }
        }
        for id in ["usd1", "usd2", "eur", "plain"] {
            assert_eq!(app.balance(id).await, 100, "{id}");
        }
    }

    pub async fn a_transfers_currency_is_part_of_its_replay_comparison(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let plain = json!({"id": "t", "from": "a", "to": "b", "amount": 1});
        let (status, body) = app.post("/transfers", plain.clone()).await;
        assert_eq!(status, 201, "{body}");
        let (status, body) = app.post("/transfers", plain).await;
        assert_eq!(status, 200, "{body}");
        let stated = json!({"id": "t", "from": "a", "to": "b", "amount": 1, "currency": "USD"});
        let (status, body) = app.post("/transfers", stated).await;
        assert_eq!(status, 409, "{body}");
    }
}

on_every_backend!(
    an_accounts_currency_is_shown_fixed_and_compared_on_replay,
    invalid_currencies_are_422_saying_why,
    a_transfer_between_currencies_rolls_back_with_currency_mismatch,
    a_transfers_currency_is_part_of_its_replay_comparison,
);
