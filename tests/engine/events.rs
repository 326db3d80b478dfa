//! The change feed's outbox (`docs/design.md §11`): every transition is recorded in the
//! transfer document by the write that makes it, so a worker that dies right after a
//! transition leaves its event in the store, and recovery finishes the transfer with every
//! event, once each, in order.

use std::collections::BTreeMap;
use std::time::Duration;

use transfer_service::store::Index;
use transfer_service::transfer::model::{TransferDoc, TransferState};
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;
use crate::support::faulty::{Fault, FaultyStore, Matcher};
use crate::support::feed::FeedLog;

/// The delay the fault injector adds to the Elasticsearch runs' requests, at most.
const JITTER: Duration = Duration::from_millis(20);

const LEASE: Duration = Duration::from_secs(2);

fn config() -> EngineConfig {
    EngineConfig {
        max_store_attempts: 3,
        ..EngineConfig::with_lease(LEASE)
    }
}

fn event_types(doc: &TransferDoc) -> Vec<&'static str> {
    doc.events().iter().map(|e| e.kind.type_name()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_after_a_transition_leaves_its_event_and_recovery_emits_the_rest() {
    let w = world(0, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), config());
    let cases = [
        ("pending", 100, 0),
        ("committed", 100, 0),
        ("finished", 100, 0),
        // The destination cannot take the credit: the transfer rolls back through terminating.
        ("terminating", 100, i64::MAX - 5),
        ("rolled-back", 100, i64::MAX - 5),
    ];
    let mut workers = Vec::new();
    for (n, (state, src, dest)) in cases.iter().enumerate() {
        for (account, balance) in [("src", *src), ("dest", *dest)] {
            recoverer
                .create_account(new_account(&format!("e{n}-{account}"), balance))
                .await
                .unwrap();
        }
        let faulty = FaultyStore::new(w.base.clone(), n as u64, Duration::ZERO);
        faulty.inject(
            Matcher::writes(Index::Transactions)
                .of_doc(format!("e{n}-t"))
                .moving_to(state),
            Fault::Crash { applied: true },
            1,
        );
        let worker = w.instance(faulty.clone(), config()).engine;
        let new = transfer(
            &format!("e{n}-t"),
            &format!("e{n}-src"),
            &format!("e{n}-dest"),
            10,
        );
        let started = worker.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(10), started.create_transfer(new)).await;
        });
        workers.push((faulty, worker));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (faulty, _) in &workers {
        assert!(faulty.is_dead(), "every worker died after its transition");
    }
    let live = || {
        workers
            .iter()
            .filter(|(f, e)| !f.is_dead() && e.running_tasks() > 0)
            .count()
    };
    recover_until_quiescent(&w, &recoverer, live, Duration::from_secs(60)).await;
    assert_invariants(&w.base).await;

    let commit = [
        "transfer.created",
        "transfer.pending",
        "transfer.committed",
        "transfer.finished",
    ];
    let rollback = [
        "transfer.created",
        "transfer.pending",
        "transfer.terminating",
        "transfer.rolled-back",
    ];
    for (n, (state, _, _)) in cases.iter().enumerate() {
        let doc = transfer_doc(&recoverer, &format!("e{n}-t")).await;
        let expected: &[&str] = if *state == "terminating" || *state == "rolled-back" {
            &rollback
        } else {
            &commit
        };
        assert_eq!(event_types(&doc), expected, "crash after {state}");
        let events = doc.events();
        assert!(
            events.windows(2).all(|p| p[0].at <= p[1].at),
            "crash after {state}: times out of order {events:?}"
        );
    }
}

/// Every transfer of `ids`, with the event types its document records, in order.
async fn histories(engine: &Engine, ids: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut expected = BTreeMap::new();
    for id in ids {
        let doc = transfer_doc(engine, id).await;
        let types = event_types(&doc).into_iter().map(String::from).collect();
        expected.insert(id.clone(), types);
    }
    expected
}

#[tokio::test(start_paused = true)]
async fn a_consumer_following_the_feed_during_a_mixed_load_sees_every_event_in_order() {
    let seed = 11;
    println!("seed {seed}");
    let w = world(seed, Duration::from_millis(3));
    let e = w.instance(w.faulty.clone(), config()).engine;
    for n in 0..6 {
        open_account(&e, &format!("a{n}"), 1_000).await;
    }
    open_account(&e, "empty", 0).await;
    open_account(&e, "sink", 0).await;
    // The consumer reads small pages while the load runs, long-polling when it has caught up.
    let consumer = {
        let e = e.clone();
        tokio::spawn(async move {
            let mut log = FeedLog::default();
            let mut after = None;
            loop {
                let page = e
                    .feed()
                    .page(after.clone(), 7, Duration::from_millis(200))
                    .await
                    .expect("a page");
                for event in &page.items {
                    log.record(
                        &event.id,
                        event.kind.type_name(),
                        &event.transfer.transaction_id,
                    );
                }
                after = page.next;
                if e.running_tasks() == 0 && page.items.is_empty() {
                    return log;
                }
            }
        })
    };
    let mut ids = Vec::new();
    for n in 0..30 {
        let id = format!("t{n}");
        let (from, to) = (format!("a{}", n % 6), format!("a{}", (n + 1) % 6));
        let new = match n % 5 {
            0 => transfer(&id, &from, &to, 3),
            1 => hold(&id, &from, &to, 4, Duration::from_secs(60)),
            2 => legs(&id, &[(&from, &to, 2), (&to, "sink", 1)]),
            3 => transfer(&id, "empty", &to, 5),
            _ => hold(&id, &from, &to, 2, Duration::from_secs(60)),
        };
        e.create_transfer(new).await.expect("created");
        ids.push(id);
    }
    // Holds ending in 1 and 6 are captured in part, those ending in 4 and 9 cancelled.
    for id in &ids {
        let capture = id.ends_with('1') || id.ends_with('6');
        if !capture && !id.ends_with('4') && !id.ends_with('9') {
            continue;
        }
        until("the hold to wait", Duration::from_secs(30), || async {
            state(&e, id).await == TransferState::Pending
        })
        .await;
        if capture {
            e.capture_transfer(id, Some(3)).await.expect("captured");
        } else {
            e.cancel_transfer(id).await.expect("cancelled");
        }
    }
    for id in &ids {
        until(
            "every transfer terminal",
            Duration::from_secs(60),
            || async { state(&e, id).await.is_terminal() },
        )
        .await;
    }
    let log = tokio::time::timeout(Duration::from_secs(60), consumer)
        .await
        .expect("the consumer catches up")
        .expect("the consumer ran");
    log.assert_complete(&histories(&e, &ids).await);
    assert!(log.received >= log.distinct());
}

#[tokio::test(start_paused = true)]
async fn a_write_answered_later_than_the_store_timeout_is_written_again_with_a_fresh_stamp() {
    let w = world(0, Duration::ZERO);
    let e = w.instance(w.faulty.clone(), config()).engine;
    open_account(&e, "src", 100).await;
    open_account(&e, "dest", 0).await;
    let late = config().request_timeout + Duration::from_millis(100);
    for (id, stall) in [("late", late), ("on-time", Duration::from_millis(10))] {
        w.faulty.inject(
            Matcher::writes(Index::Transactions)
                .of_doc(id)
                .moving_to("finished"),
            Fault::StallAfter(stall),
            1,
        );
        start_transfer(&e, id, "src", "dest", 1).await;
        assert_eq!(
            terminal_without_recovery(&e, id).await,
            TransferState::Finished
        );
        // The stalled answer comes after the write is visible: wait for its worker.
        until("the worker to end", Duration::from_secs(10), || async {
            e.running_tasks() == 0
        })
        .await;
    }
    // The history keeps the stamp of the write that recorded `finished`; the document's stamp
    // is the re-stamp's, a request timeout later.
    let stamp_of = |doc: &TransferDoc| doc.modification_time.millis();
    let finished_at = |doc: &TransferDoc| doc.events().last().unwrap().at;
    let late_doc = transfer_doc(&e, "late").await;
    assert!(
        stamp_of(&late_doc) >= finished_at(&late_doc) + late.as_millis() as i64,
        "re-stamped after the late answer: {late_doc:?}"
    );
    let on_time = transfer_doc(&e, "on-time").await;
    assert_eq!(stamp_of(&on_time), finished_at(&on_time), "not re-stamped");
}

#[tokio::test(start_paused = true)]
async fn a_terminal_write_applied_without_any_answer_is_re_stamped_by_its_writer() {
    let w = world(0, Duration::ZERO);
    let instance = w.instance(w.faulty.clone(), config());
    let e = instance.engine.clone();
    open_account(&e, "src", 100).await;
    open_account(&e, "dest", 0).await;
    // The first attempt is applied and its answer lost; the other attempts fail unapplied,
    // so the writer never hears of its write.
    let finished = || {
        Matcher::writes(Index::Transactions)
            .of_doc("t")
            .moving_to("finished")
    };
    w.faulty.inject(finished(), Fault::FailAfter, 1);
    let retries = config().max_store_attempts as usize - 1;
    w.faulty.inject(finished(), Fault::FailBefore, retries);
    start_transfer(&e, "t", "src", "dest", 1).await;
    until("the worker to give up", Duration::from_secs(30), || async {
        e.running_tasks() == 0
    })
    .await;
    assert_eq!(state(&e, "t").await, TransferState::Finished);
    assert_eq!(
        instance.metrics.transfers_restamped_total.get(),
        1,
        "the applied write found and re-stamped"
    );
}

/// On Elasticsearch (in real time) the feed stays below its
/// horizon: a consumer reading all along, on an instance whose clock is ahead of the writer's
/// by almost what `docs/design.md §9` allows (1.9 skew margins), while the writer's transfer
/// writes are applied 0.45 s after they are sent (under `STORE_TIMEOUT`), still sees every
/// event of every transfer, in order. With a horizon of one skew margin instead of two, a
/// write stamped by the slow clock and applied late can fall behind the cursor: this test
/// then fails in some runs (one in four here; the gap needs a refresh late in its interval).
/// On the emulator (a test double) and on the real cluster, with its real one-second refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_elasticsearch_a_reader_ahead_of_a_slow_writer_misses_nothing() {
    let seed = 5;
    println!("seed {seed}");
    a_reader_ahead_of_a_slow_writer_misses_nothing(world_on_emulator(seed, JITTER).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_elasticsearch_a_reader_ahead_of_a_slow_writer_misses_nothing() {
    let seed = 5;
    println!("seed {seed}");
    let Some(w) = world_on_real_cluster(seed, JITTER).await else {
        return;
    };
    a_reader_ahead_of_a_slow_writer_misses_nothing(w).await;
}

async fn a_reader_ahead_of_a_slow_writer_misses_nothing(w: World) {
    let margin = config().skew_margin;
    let behind = -(margin.as_millis() as i64 * 19 / 10);
    let writer = w.instance_with_clock(w.faulty.clone(), config(), w.clock.skewed(behind));
    let reader = w.instance(w.base.clone(), config()).engine;
    assert!(
        Duration::from_millis(450) < config().request_timeout,
        "stalls stay under STORE_TIMEOUT, or the writer re-stamps"
    );
    w.faulty.inject(
        Matcher::writes(Index::Transactions),
        Fault::StallBefore(Duration::from_millis(450)),
        1_000,
    );
    for n in 0..4 {
        open_account(&writer, &format!("a{n}"), 1_000).await;
    }
    let consumer = {
        let reader = reader.clone();
        tokio::spawn(async move {
            let mut log = FeedLog::default();
            let mut after = None;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while tokio::time::Instant::now() < deadline {
                let page = reader.feed().page(after.clone(), 3, Duration::ZERO).await;
                let page = page.expect("a page");
                for event in &page.items {
                    let transfer = &event.transfer.transaction_id;
                    log.record(&event.id, event.kind.type_name(), transfer);
                }
                after = page.next;
                tokio::time::sleep(Duration::from_millis(20)).await;
                if log.distinct() >= 4 * 24 {
                    break;
                }
            }
            log
        })
    };
    let mut ids = Vec::new();
    for n in 0..24 {
        let id = format!("t{n}");
        let (from, to) = (format!("a{}", n % 4), format!("a{}", (n + 1) % 4));
        writer
            .create_transfer(transfer(&id, &from, &to, 1))
            .await
            .expect("created");
        ids.push(id);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        until(
            "every transfer finished",
            Duration::from_secs(60),
            || async { state(&reader, id).await == TransferState::Finished },
        )
        .await;
    }
    let log = consumer.await.expect("the consumer ran");
    eprintln!(
        "re-stamped {}, received {} events",
        writer.metrics.transfers_restamped_total.get(),
        log.received
    );
    log.assert_complete(&histories(&reader, &ids).await);
}
