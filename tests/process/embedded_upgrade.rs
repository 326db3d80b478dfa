//! The embedded store across versions (`docs/operations.md`, "The embedded store's files"): a
//! store written by the last version of each earlier layout of the statements' index (keyed
//! by a tuple, then a row per entry) opens in this one with every statement whole, and that
//! version opens it again afterwards with this one's entries in its statements (it builds its
//! own index again from the documents).

use super::*;
use support::old_version::{ROW_KEYED_STATEMENTS, TUPLE_KEYED_STATEMENTS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_tuple_keyed_index_keeps_its_statements_up_and_down_again() {
    keeps_its_statements_up_and_down_again(TUPLE_KEYED_STATEMENTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_row_keyed_index_keeps_its_statements_up_and_down_again() {
    keeps_its_statements_up_and_down_again(ROW_KEYED_STATEMENTS).await;
}

/// The older version `commit` writes three transfers' entries, this one opens its store and
/// adds a fourth, and `commit` opens it again: every statement is the same on both.
async fn keeps_its_statements_up_and_down_again(commit: &str) {
    let Some(older) = support::old_version::binary(commit) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let env = vec![("DATA_DIR", dir.path().display().to_string())];

    let old = Service::start_binary_ready(&older, &env).await;
    open_two_accounts(&old.base).await;
    for n in 1..=3 {
        transfer_and_finish(&old.base, &format!("before-{n}")).await;
    }
    let before = statement(&old.base).await;
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(old.terminate().0.success());

    let new = Service::start_ready(&env).await;
    assert_eq!(statement(&new.base).await, before);
    transfer_and_finish(&new.base, "after").await;
    let after = statement(&new.base).await;
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(
        after[1..],
        before[..],
        "the new entry comes first, the older ones unchanged"
    );
    assert!(new.terminate().0.success());

    let old = Service::start_binary_ready(&older, &env).await;
    assert_eq!(statement(&old.base).await, after);
}

async fn open_two_accounts(base: &str) {
    let client = reqwest::Client::new();
    for (id, balance) in [("payer", 100), ("payee", 0)] {
        let body = json!({"id": id, "balance": balance});
        let answer = post(&client, base, "/accounts", &body).await;
        assert!(matches!(answer, Some((201, _))), "{answer:?}");
    }
}

/// Posts transfer `id` of 7 units from `payer` to `payee` and waits until it is finished.
async fn transfer_and_finish(base: &str, id: &str) {
    let client = reqwest::Client::new();
    let body = json!({"id": id, "from": "payer", "to": "payee", "amount": 7});
    let answer = post(&client, base, "/transfers", &body).await;
    assert!(matches!(answer, Some((201, _))), "{answer:?}");
    let path = format!("/transfers/{id}");
    support::wait::eventually(&format!("{id} to finish"), || async {
        get_ok(&client, base, &path).await["state"] == "finished"
    })
    .await;
}

/// `payer`'s statement, newest first: each entry's seq, transfer, amount and balance after.
async fn statement(base: &str) -> Vec<(u64, String, i64, i64)> {
    let page = get_ok(&reqwest::Client::new(), base, "/accounts/payer/entries").await;
    let items = page["items"].as_array().expect("items").iter();
    items
        .map(|item| {
            (
                item["seq"].as_u64().expect("seq"),
                item["transfer_id"]
                    .as_str()
                    .expect("transfer_id")
                    .to_owned(),
                item["amount"].as_i64().expect("amount"),
                item["balance_after"].as_i64().expect("balance_after"),
            )
        })
        .collect()
}
