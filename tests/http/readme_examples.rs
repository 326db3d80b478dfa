//! The README's API examples, run as written: every `curl` command of "The API by example",
//! in order, by `sh` and `curl` against a fresh service on the embedded store (only
//! `localhost:8080` is replaced by its address), so the examples cannot drift from the
//! service.
//!
//! What each example promises is checked two ways: the status the table [`PROMISES`] gives
//! for it (a table row per command, matched to the command by a piece of it, so an example
//! added, dropped or reordered fails here), and every `"field":value` the example's comments
//! show (`# {"id":"t-1",...,"state":"finished",...}`), which must occur in the answer.
//! Needs `curl` (`.ci/run` installs it); without it the test fails under CI and skips loudly
//! elsewhere.

use regex::Regex;
use serde_json::Value;

use crate::support::app::{Backend, TestApp};
use crate::support::skip;

/// What one example promises: a piece of its command, the status it answers, and the fields
/// its prose promises that no `"field":value` comment shows.
type Promise = (&'static str, u16, &'static [(&'static str, &'static str)]);

/// Each example's promise, in order.
const PROMISES: &[Promise] = &[
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

/// One example: the command as written, and the comments that belong to it (those on its
/// line and the `# ` lines right after it).
#[derive(Debug)]
struct Example {
    command: String,
    comments: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_api_examples_answer_what_their_comments_say() {
    if !skip::on_path("curl") {
        skip::or_fail_under_ci("the README examples test", "curl is not installed");
        return;
    }
    let examples = examples_of(&readme_section("## The API by example"));
    let commands: Vec<&str> = examples.iter().map(|e| e.command.as_str()).collect();
    assert_eq!(examples.len(), PROMISES.len(), "{commands:#?}");
    let app = TestApp::spawn(Backend::Embedded).await;
    let address = app.base.trim_start_matches("http://").to_owned();
    let mut last_answer = Value::Null;
    for (example, (piece, status, promised)) in examples.iter().zip(PROMISES) {
        assert!(
            example.command.contains(piece),
            "the README's examples changed: `{piece}` is not in {}",
            example.command
        );
        let command =
            with_cursor_of(&example.command, &last_answer).replace("localhost:8080", &address);
        let (answered, body) = run(&command).await;
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
}

/// The first ```sh block after `heading` in README.md.
fn readme_section(heading: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = &readme[readme.find(heading).expect("the section")..];
    let start = section.find("```sh\n").expect("a sh block") + "```sh\n".len();
    section[start..start + section[start..].find("```").expect("its end")].to_owned()
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

/// The `<next_cursor from the previous page>` placeholder, filled from the last answer.
fn with_cursor_of(command: &str, last_answer: &Value) -> String {
    match last_answer["next_cursor"].as_str() {
        Some(cursor) => Regex::new("<next_cursor[^>]*>")
            .unwrap()
            .replace(command, cursor)
            .into_owned(),
        None => command.to_owned(),
    }
}

/// Runs `command` with `sh`, its status written after the answer; the answer's JSON body.
async fn run(command: &str) -> (u16, Value) {
    let command = format!("{command} -w '\\n%{{http_code}}'");
    let out = tokio::process::Command::new("sh")
        .args(["-c", &command])
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
        .filter(|c| !c[2].contains("...")) // "2026-...Z": a value shown in part
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
