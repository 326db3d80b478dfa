//! The documentation's API examples, run as written: every `curl` command of the README's "The
//! API by example" and then of the API guide (`docs/api.md`), in order, by `sh` and `curl`
//! against a fresh service on the embedded store (only `localhost:8080` is replaced by its
//! address, and a sample feed cursor by the one the feed answered before), so the examples
//! cannot drift from the service. The guide's API-keys examples run on a service of their own,
//! started with the keys file the guide's own commands make.
//!
//! What each example promises is checked two ways: the status a table of promises gives for
//! it (a row per command, matched to the command by a piece of it, so an example added,
//! dropped or reordered fails here), and every `"field":value` the example's comments show
//! (`# {"id":"t-1",...,"state":"finished",...}`), which must occur in the answer.
//! Needs `curl` (`.ci/run` installs it); without it the test fails under CI and skips loudly
//! elsewhere.

use regex::Regex;
use serde_json::Value;

use crate::support::app::{Backend, TestApp};
use crate::support::skip;

/// What one example promises: a piece of its command, the status it answers, and the fields
/// its prose promises that no `"field":value` comment shows.
type Promise = (&'static str, u16, &'static [(&'static str, &'static str)]);

/// The README's examples, in order.
const README: &[Promise] = &[
    (r#""id":"alice""#, 201, &[]),
    (r#""id":"bob""#, 201, &[]),
    (r#""id":"t-1","from"#, 201, &[]),
    ("transfers/t-1?wait=5s", 200, &[]),
    ("accounts/alice", 200, &[]),
    (r#""id":"t-2""#, 201, &[]),
    ("transfers/t-2?wait=5s", 200, &[]),
    (r#""id":"t-1","from"#, 200, &[]),
    ("transfers/t-1/cancel", 409, &[]),
    (r#""id":"auth-1""#, 201, &[]),
    ("transfers/auth-1?wait=5s", 200, &[]),
    (r#"{"amount":60}"#, 200, &[]),
    ("transfers/auth-1/capture", 409, &[]),
    (r#""id":"auth-2""#, 201, &[]),
    ("transfers/auth-2/cancel", 200, &[("reason", "cancelled")]),
    ("transfers/batch", 200, &[]),
    ("state=finished&limit=", 200, &[]),
    ("cursor=", 200, &[]),
];

/// The API guide's examples, in order, after the README's on the same service.
const GUIDE: &[Promise] = &[
    (r#""id":"alice-usd""#, 201, &[]),
    (r#""id":"bob-eur""#, 201, &[]),
    (r#""id":"fx-1""#, 201, &[]),
    ("transfers/fx-1?wait=5s", 200, &[]),
    (r#""currency":"usd""#, 422, &[]),
    (r#""id":"shop""#, 201, &[]),
    (r#""id":"fees""#, 201, &[]),
    (r#""id":"pay-1""#, 201, &[]),
    ("transfers/pay-1?wait=5s", 200, &[]),
    ("transfers?account=fees", 200, &[]),
    (r#""id":"pay-2""#, 201, &[]),
    ("transfers/pay-2?wait=5s", 200, &[]),
    (r#"{"from":"alice","legs""#, 422, &[]),
    ("accounts/fees/entries'", 200, &[]),
    ("text/csv", 200, &[]),
    ("balance?at=2100", 200, &[]),
    ("balance?at=2000", 422, &[]),
    (r#""id":"carol""#, 201, &[]),
    (r#""order_id":"123","shop""#, 201, &[]),
    ("metadata=order_id:123", 200, &[]),
    (r#""order_id":"124""#, 409, &[]),
    (r#""Order":"1""#, 422, &[]),
    ("idempotency-key: t-9' -d '{\"from", 201, &[]),
    ("idempotency-key: t-9' -d '{\"from", 200, &[]),
    (r#""id":"t-10""#, 422, &[]),
    ("idempotency-key: b-1", 200, &[]),
    ("events?limit=100", 200, &[]),
    ("wait=30s", 200, &[]),
    ("events?after=now", 200, &[]),
    ("after=yesterday", 422, &[]),
];

/// The guide's API-keys examples, on a fresh service that requires keys.
const KEYS: &[Promise] = &[
    ("Bearer $KEY", 404, &[]),
    ("curl -si localhost:8080/accounts/alice ", 401, &[]),
    ("Bearer not-a-key", 401, &[]),
    ("Bearer $DASHBOARD_KEY", 403, &[]),
];

/// One example: the command as written, and the comments that belong to it (those on its
/// line and the `# ` lines right after it).
#[derive(Debug)]
struct Example {
    command: String,
    comments: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_and_the_guides_api_examples_answer_what_their_comments_say() {
    if !curl_present() {
        return;
    }
    let app = TestApp::spawn(Backend::Embedded).await;
    let readme = examples_of(&sh_blocks("README.md", "## The API by example")[0]);
    let guide: Vec<Example> = sh_blocks("docs/api.md", "")
        .iter()
        .filter(|block| block.contains("curl ") && !block.contains("API_KEYS_FILE"))
        .flat_map(|block| examples_of(block))
        .collect();
    let mut last_answer = Value::Null;
    for (examples, promises) in [(readme, README), (guide, GUIDE)] {
        last_answer = run_all(&app, &examples, promises, &[], last_answer).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_api_key_examples_answer_what_their_comments_say() {
    if !curl_present() {
        return;
    }
    let block = sh_blocks("docs/api.md", "")
        .into_iter()
        .find(|block| block.contains("API_KEYS_FILE"))
        .expect("the API keys block");
    // The block's own lines make the keys and the file, up to the line that starts the service.
    let dir = tempfile::tempdir().expect("temp dir");
    let making: String = block
        .lines()
        .take_while(|line| !line.contains("API_KEYS_FILE"))
        .map(|line| format!("{line}\n"))
        .collect();
    let made = tokio::process::Command::new("sh")
        .args(["-c", &format!("{making}echo \"$KEY $DASHBOARD_KEY\"")])
        .current_dir(dir.path())
        .output()
        .await
        .expect("run sh");
    let made = String::from_utf8_lossy(&made.stdout).into_owned();
    let (key, dashboard_key) = made.trim().split_once(' ').expect("two keys");
    let keys_file = dir.path().join("api-keys");
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.api_keys_file = Some(keys_file)).await;
    let env = [("KEY", key), ("DASHBOARD_KEY", dashboard_key)];
    run_all(&app, &examples_of(&block), KEYS, &env, Value::Null).await;
}

/// Posts a transfer in a moment, for a long-poll of the feed to answer with.
fn wake_the_feed_soon(app: &TestApp) {
    let (client, url) = (app.client.clone(), app.url("/transfers"));
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let body = serde_json::json!({"id": "wake-up", "from": "alice", "to": "bob", "amount": 1});
        let answer = client
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("a transfer");
        assert_eq!(answer.status(), 201);
    });
}

/// Whether `curl` is here; without it, a failure under CI and a loud skip elsewhere.
fn curl_present() -> bool {
    let present = skip::on_path("curl");
    if !present {
        skip::or_fail_under_ci("the documentation's examples test", "curl is not installed");
    }
    present
}

/// Runs `examples` in order against `app`, each checked against its promise; the last answer.
async fn run_all(
    app: &TestApp,
    examples: &[Example],
    promises: &[Promise],
    env: &[(&str, &str)],
    mut last_answer: Value,
) -> Value {
    let commands: Vec<&str> = examples.iter().map(|e| e.command.as_str()).collect();
    assert_eq!(examples.len(), promises.len(), "{commands:#?}");
    let address = app.base.trim_start_matches("http://").to_owned();
    for (example, (piece, status, promised)) in examples.iter().zip(promises) {
        assert!(
            example.command.contains(piece),
            "the examples changed: `{piece}` is not in {}",
            example.command
        );
        let command = with_cursor_of(&example.command, &last_answer);
        if command.contains("events?") && command.contains("wait=") {
            // "wait up to 30 s for something": something happens while it waits.
            wake_the_feed_soon(app);
        }
        let (answered, body) = run(&command.replace("localhost:8080", &address), env).await;
        assert_eq!(answered, *status, "{}\nanswered {body}", example.command);
        let mut wanted = shown_fields(&example.comments);
        wanted.extend(
            promised
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(*v))),
        );
        for (field, value) in wanted {
            assert!(
                occurs(&body, &field, &value),
                "{}\npromises \"{field}\":{value}, answered {body}",
                example.command
            );
        }
        last_answer = body;
    }
    last_answer
}

/// The ```sh blocks of `file` (relative to the repository) after `heading`.
fn sh_blocks(file: &str, heading: &str) -> Vec<String> {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect(file);
    let mut rest = &text[text.find(heading).expect("the section")..];
    let mut blocks = Vec::new();
    while let Some(start) = rest.find("```sh\n") {
        rest = &rest[start + "```sh\n".len()..];
        let end = rest.find("```").expect("the block's end");
        blocks.push(rest[..end].to_owned());
        rest = &rest[end + 3..];
    }
    blocks
}

/// The block's commands (continued over lines ending in `\`) with their comments.
fn examples_of(block: &str) -> Vec<Example> {
    let mut examples: Vec<Example> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        let trimmed = line.trim();
        if continued {
            let example = examples.last_mut().expect("a command");
            push_command_line(example, trimmed);
            continued = trimmed.ends_with('\\');
        } else if trimmed.starts_with("curl ") {
            let mut example = Example {
                command: String::new(),
                comments: String::new(),
            };
            push_command_line(&mut example, trimmed);
            continued = trimmed.ends_with('\\');
            examples.push(example);
        } else if let (Some(comment), Some(example)) =
            (trimmed.strip_prefix('#'), examples.last_mut())
        {
            example.comments.push_str(comment);
            example.comments.push('\n');
        }
    }
    examples
}

/// Adds one line of a command; a comment after it (`  # ...`) belongs to the example.
fn push_command_line(example: &mut Example, line: &str) {
    let (code, comment) = match line.find("  #") {
        Some(at) => (&line[..at], &line[at + 3..]),
        None => (line, ""),
    };
    example.command.push_str(code.trim_end_matches('\\').trim());
    example.command.push(' ');
    example.comments.push_str(comment);
    example.comments.push('\n');
}

/// A cursor the examples show (`<next_cursor from the previous page>`, or a sample feed
/// cursor `e5c0f3a9d2b1e8f7a~42`), replaced by the one the last answer gave.
fn with_cursor_of(command: &str, last_answer: &Value) -> String {
    match last_answer["next_cursor"].as_str() {
        Some(cursor) => Regex::new("<next_cursor[^>]*>|[0-9a-f]{8,}~[0-9]+")
            .unwrap()
            .replace(command, cursor)
            .into_owned(),
        None => command.to_owned(),
    }
}

/// Runs `command` with `sh` (with `env`), its status written after the answer; the
/// answer's JSON body.
async fn run(command: &str, env: &[(&str, &str)]) -> (u16, Value) {
    let command = format!("{command} -w '\\n%{{http_code}}'");
    let out = tokio::process::Command::new("sh")
        .args(["-c", &command])
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run sh");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let (answer, status) = out.rsplit_once('\n').expect("a status line");
    // With `-i` the headers come first.
    let body = answer.rsplit("\r\n\r\n").next().unwrap_or(answer);
    let status = status.trim().parse().expect("a status");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Every `"field":value` (a string, number, boolean or null) the comments show.
fn shown_fields(comments: &str) -> Vec<(String, Value)> {
    let pair = Regex::new(r#""([a-z_]+)":("[^"]*"|-?[0-9]+|true|false|null)"#).unwrap();
    pair.captures_iter(comments)
        // "2026-...Z": a value shown in part; a cursor: a sample, not this service's.
        .filter(|c| (!c[2].contains("...") && &c[1] != "next_cursor") || &c[2] == "null")
        .map(|c| {
            (
                c[1].to_owned(),
                serde_json::from_str(&c[2]).expect("a JSON value"),
            )
        })
        .collect()
}

/// Whether `field` has `value` anywhere in `answer`.
fn occurs(answer: &Value, field: &str, value: &Value) -> bool {
    match answer {
        Value::Object(map) => {
            map.get(field) == Some(value) || map.values().any(|v| occurs(v, field, value))
        }
        Value::Array(items) => items.iter().any(|v| occurs(v, field, value)),
        _ => false,
    }
}

/// The query parameters of a `curl` command's URL, but `cursor`, in order.
fn filters_of(command: &str) -> Vec<String> {
    let Some(query) = command.split('?').nth(1) else {
        return Vec::new();
    };
    let query = query.split(['\'', ' ']).next().unwrap_or("");
    query
        .split('&')
        .filter(|pair| !pair.starts_with("cursor="))
        .map(str::to_owned)
        .collect()
}

/// A listing's cursor continues only the listing it came from (its filters and page size):
/// every example that follows a cursor gives the same parameters as the page before it.
#[test]
fn a_cursor_example_repeats_the_filters_of_the_page_it_continues() {
    let mut checked = 0;
    let mut blocks = sh_blocks("README.md", "## The API by example");
    blocks.extend(sh_blocks("docs/api.md", ""));
    for block in &blocks {
        let examples = examples_of(block);
        for pair in examples.windows(2) {
            let (page, next) = (&pair[0].command, &pair[1].command);
            if !next.contains("cursor=<next_cursor") {
                continue;
            }
            assert_eq!(
                filters_of(next),
                filters_of(page),
                "`{next}` continues `{page}` with other filters"
            );
            checked += 1;
        }
    }
    assert!(checked >= 1, "no cursor example found");
}
