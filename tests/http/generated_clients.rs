//! Clients generated from the committed OpenAPI document (`openapi/openapi.json`, equal to the
//! served one) by three mainstream generators, each running one scenario against a fresh
//! service on the embedded store: Python (openapi-python-client), Java (openapi-generator's
//! `java` generator, built and run with Maven) and TypeScript (openapi-typescript's types,
//! called through openapi-fetch and checked by `tsc`). The scenario (the same in each language,
//! in `tools/generated-clients/<language>/`) opens accounts, polls a one-leg transfer to its
//! end, makes a multi-leg one, lists by account, state and metadata, captures one hold in part
//! and one whole with no body, cancels one, sends a batch with a rolled-back and a refused
//! item, reads a problem as the declared type and follows the feed by its cursor. No generated
//! line is edited and no token is given (the service has no API keys).
//!
//! The commands are the ones `docs/api.md` ("Generated clients") gives, run in the language's
//! directory; a test checks the guide still gives each of them. A generator's warning fails
//! the test, except the ones it prints for every OpenAPI 3.1 document ([`KNOWN_WARNINGS`]).
//! The tools (`python3` with `venv`, Java and Maven, Node.js and npm) are installed by
//! `.ci/run`; without one, its test fails under CI and skips loudly elsewhere. The packages
//! come from PyPI, Maven Central and npm at test time, cached between runs (a venv and
//! `node_modules` in the language's directory, `~/.m2`, npm's cache). One client at a time:
//! a generator and a compiler are heavy on a small machine.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{json, Value};

use crate::support::app::{Backend, TestApp};
use crate::support::skip;

/// Where each language's project is.
const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/generated-clients");

/// The guide that gives the commands.
const GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md");

/// The URL the guide's commands name; the test gives its service's instead.
const GUIDE_URL: &str = "http://localhost:8080";

/// Warnings a generator prints for any OpenAPI 3.1 document, so for this one whatever it
/// holds (the document is 3.1: utoipa writes no other version). Any other warning fails.
const KNOWN_WARNINGS: &[(&str, &str)] = &[
    (
        "OpenAPI 3.1 support is still in beta",
        "openapi-generator 7.25.0, for every 3.1 document",
    ),
    (
        "Failed to get the schema name: null",
        "openapi-generator 7.25.0, for every 3.1 document with `additionalProperties` (a \
         document of one schema with `additionalProperties: false` is enough; none for 3.0): \
         the bodies are closed (strict input) and metadata is a map",
    ),
];

/// One command of a language's recipe, run in its directory. `{url}` is the service's URL.
struct Step {
    command: &'static str,
    /// Its output is a generator's: a warning fails the test.
    generates: bool,
}

const fn step(command: &'static str) -> Step {
    Step {
        command,
        generates: false,
    }
}

const fn generator(command: &'static str) -> Step {
    Step {
        command,
        generates: true,
    }
}

/// One language: its directory, the tools it needs, its recipe.
struct Language {
    name: &'static str,
    dir: &'static str,
    /// Executables that must be on the `PATH`, and how to get them.
    tools: &'static [&'static str],
    install: &'static str,
    steps: &'static [Step],
}

const PYTHON: Language = Language {
    name: "python",
    dir: "python",
    tools: &["python3"],
    install: "apt-get install python3 python3-venv",
    steps: &[
        step("python3 -m venv .venv"),
        step(".venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt"),
        generator(
            "openapi-python-client generate --path ../../../openapi/openapi.json --meta none \
             --output-path generated/transfer_service_client --overwrite",
        ),
        step("PYTHONPATH=generated python scenario.py {url}"),
    ],
};

const JAVA: Language = Language {
    name: "java",
    dir: "java",
    tools: &["java", "mvn"],
    install: "apt-get install openjdk-17-jdk-headless maven",
    steps: &[generator("mvn -B compile exec:java -Dtransfer.url={url}")],
};

const TYPESCRIPT: Language = Language {
    name: "typescript",
    dir: "typescript",
    tools: &["node", "npm"],
    install: "apt-get install nodejs npm",
    steps: &[
        step("npm ci --no-audit --no-fund"),
        generator("npx openapi-typescript ../../../openapi/openapi.json -o generated/schema.d.ts"),
        step("npx tsc -p ."),
        step("node dist/scenario.js {url}"),
    ],
};

/// Serializes the three tests.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_client_runs_the_scenario() {
    run_scenario(&PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_java_client_runs_the_scenario() {
    run_scenario(&JAVA).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_typescript_client_runs_the_scenario() {
    run_scenario(&TYPESCRIPT).await;
}

#[test]
fn the_guide_gives_each_command_the_test_runs() {
    let guide = std::fs::read_to_string(GUIDE).expect("docs/api.md");
    for language in [&PYTHON, &JAVA, &TYPESCRIPT] {
        let cd = format!("cd tools/generated-clients/{}", language.dir);
        assert!(guide.contains(&cd), "docs/api.md does not say `{cd}`");
        for step in language.steps {
            let command = step.command.replace("{url}", GUIDE_URL);
            assert!(
                guide.contains(&command),
                "docs/api.md does not give the {} command `{command}`",
                language.name
            );
        }
    }
}

/// Runs `language`'s recipe against a fresh service; skipped (loudly) without its tools,
/// except under CI.
async fn run_scenario(language: &Language) {
    if let Some(missing) = missing_tool(language) {
        let what = format!("the generated {} client's scenario", language.name);
        skip::or_fail_under_ci(&what, &missing);
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let app = TestApp::spawn(Backend::Embedded).await;
    let dir = Path::new(CLIENTS).join(language.dir);
    for (i, step) in language.steps.iter().enumerate() {
        let command = step.command.replace("{url}", &app.base);
        if command.starts_with("python3 -m venv") && venv_works(&dir).await {
            continue;
        }
        let output = run(&dir, &command).await;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "{}: `{command}` failed ({}):\n{said}",
            language.name,
            output.status
        );
        if step.generates {
            let warnings = unknown_warnings(&said);
            assert!(
                warnings.is_empty(),
                "{}: `{command}` warned:\n{}\n(all it said:\n{said})",
                language.name,
                warnings.join("\n")
            );
        }
        if i + 1 == language.steps.len() {
            let passed = format!("{} scenario passed", language.name);
            assert!(
                said.contains(&passed),
                "{}: no `{passed}` in:\n{said}",
                language.name
            );
        }
    }
    app.shutdown().await;
}

/// The first tool `language` needs that this machine lacks, and how to get it.
fn missing_tool(language: &Language) -> Option<String> {
    let missing: Vec<&str> = language
        .tools
        .iter()
        .copied()
        .filter(|tool| !skip::on_path(tool))
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{} not found ({})",
            missing.join(" and "),
            language.install
        ));
    }
    if language.name == "python" {
        let venv = std::process::Command::new("python3")
            .args(["-c", "import ensurepip, venv"])
            .output();
        if !venv.is_ok_and(|o| o.status.success()) {
            return Some(format!("python3 cannot make a venv ({})", language.install));
        }
    }
    None
}

/// Whether the venv a previous run made still runs (a new Python breaks it).
async fn venv_works(dir: &Path) -> bool {
    tokio::process::Command::new(dir.join(".venv/bin/python"))
        .args(["-c", "import sys"])
        .output()
        .await
        .is_ok_and(|o| o.status.success())
}

/// `command` by `sh` in `dir`, with the venv's executables (if any) first on the `PATH`, as
/// after `. .venv/bin/activate`.
async fn run(dir: &Path, command: &str) -> Output {
    let mut path: Vec<PathBuf> = vec![dir.join(".venv/bin")];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    tokio::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(dir)
        .env("PATH", std::env::join_paths(path).expect("a PATH"))
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run `{command}`: {e}"))
}

/// The lines of a generator's output that warn, but for [`KNOWN_WARNINGS`].
fn unknown_warnings(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|line| {
            let lower = line.to_ascii_lowercase();
            lower.contains("warn") || line.contains('⚠')
        })
        .filter(|line| !KNOWN_WARNINGS.iter().any(|(known, _)| line.contains(known)))
        .collect()
}

#[test]
fn a_generators_warning_is_seen_unless_it_is_a_known_one() {
    let maven = "[INFO] Generating\n\
        [WARNING] OpenAPI 3.1 support is still in beta. To report an issue ...\n\
        [WARNING] Failed to get the schema name: null\n\
        [INFO] BUILD SUCCESS";
    assert!(unknown_warnings(maven).is_empty());
    let python = "Generating generated/transfer_service_client\n\
        Warning(s) encountered while generating. Client was generated, but some pieces may be missing";
    assert_eq!(unknown_warnings(python).len(), 1);
    let typescript = "✨ openapi-typescript 7.13.0\n⚠ something odd\n🚀 done";
    assert_eq!(unknown_warnings(typescript), ["⚠ something odd"]);
    let java = "[WARNING] Ignoring complex example on request body";
    assert_eq!(unknown_warnings(java).len(), 1);
}

/// A component schema of the document.
fn schema<'d>(doc: &'d Value, name: &str) -> &'d Value {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    schema
}

/// The schema `reference` (`#/components/schemas/<name>`) names.
fn referenced<'d>(doc: &'d Value, reference: &Value) -> &'d Value {
    let name = reference["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
        .unwrap_or_else(|| panic!("a component reference: {reference}"));
    schema(doc, name)
}

/// What the generators above were broken by, each checked in the document and, where the
/// server takes part, against the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_states_what_generated_clients_need() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (_, doc) = app.get("/openapi.json").await;

    // A body that may be absent is optional, never `null`.
    let capture = &doc["paths"]["/transfers/{id}/capture"]["post"]["requestBody"];
    assert_eq!(capture["required"], false, "{capture}");
    assert_eq!(
        capture["content"]["application/json"]["schema"],
        json!({"$ref": "#/components/schemas/CaptureHold"})
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let body = &operation["requestBody"]["content"]["application/json"]["schema"];
            assert!(
                !body.to_string().contains(r#"{"type":"null"}"#),
                "{method} {path}: a body schema that allows null: {body}"
            );
        }
    }

    // A transfer is one of two closed shapes with their required fields.
    let transfer = schema(&doc, "CreateTransfer");
    let shapes: Vec<&Value> = transfer["oneOf"]
        .as_array()
        .expect("CreateTransfer is a oneOf")
        .iter()
        .map(|shape| referenced(&doc, shape))
        .collect();
    assert_eq!(shapes.len(), 2);
    let (one, multi) = (shapes[0], shapes[1]);
    assert_eq!(one["required"], json!(["from", "to", "amount"]));
    assert!(one["properties"].get("legs").is_none(), "{one}");
    assert_eq!(multi["required"], json!(["legs"]));
    for field in ["from", "to", "amount"] {
        assert!(
            multi["properties"].get(field).is_none(),
            "{field} in {multi}"
        );
    }
    for shape in [one, multi] {
        assert_eq!(shape["additionalProperties"], false, "{shape}");
    }
    // ... and `legs: []`, what a client filling every field would send, is refused.
    let (status, problem) = app
        .post(
            "/transfers",
            json!({"from": "a", "to": "b", "amount": 1, "legs": []}),
        )
        .await;
    assert_eq!(status, 422, "{problem}");

    // A batch item is told apart by its discriminator, which every item the server answers has.
    let item = schema(&doc, "BatchItem");
    assert_eq!(item["discriminator"]["propertyName"], "outcome", "{item}");
    for (value, target) in item["discriminator"]["mapping"].as_object().unwrap() {
        let variant = referenced(&doc, &json!({ "$ref": target }));
        assert_eq!(variant["properties"]["outcome"]["enum"], json!([value]));
        assert!(variant["required"]
            .as_array()
            .unwrap()
            .contains(&json!("outcome")));
    }
    app.open_accounts([("A", 10), ("B", 0)]).await;
    let (status, batch) = app
        .batch(vec![
            json!({"from": "A", "to": "B", "amount": 1}),
            json!({"from": "A", "to": "A", "amount": 1}),
        ])
        .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["items"][0]["outcome"], "transfer", "{batch}");
    assert!(batch["items"][0]["transfer"].is_object(), "{batch}");
    assert_eq!(batch["items"][1]["outcome"], "problem", "{batch}");
    assert_eq!(batch["items"][1]["problem"]["status"], 422, "{batch}");

    // An event's time is a date-time, its type one of an enum that holds what the feed sends.
    let event = schema(&doc, "Event");
    assert_eq!(event["properties"]["at"]["format"], "date-time");
    let types = event["properties"]["type"]["enum"].as_array().unwrap();
    assert_eq!(types.len(), 7, "six states and the capture: {types:?}");
    let (_, feed) = app.get("/events?limit=1000").await;
    let events = feed["items"].as_array().unwrap();
    assert!(!events.is_empty());
    for event in events {
        assert!(types.contains(&event["type"]), "{event}");
    }

    // The metadata filter is an array parameter whose form the server takes, repeated.
    let parameters = doc["paths"]["/transfers"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let metadata = parameters
        .iter()
        .find(|p| p["name"] == "metadata")
        .expect("a `metadata` parameter");
    assert_eq!(metadata["schema"]["type"], "array", "{metadata}");
    assert_eq!(
        (&metadata["style"], &metadata["explode"]),
        (&json!("form"), &json!(true))
    );
    assert!(
        parameters
            .iter()
            .all(|p| !p["name"].as_str().unwrap().contains('{')),
        "no parameter named after a template: {parameters:?}"
    );
    let (status, page) = app.get("/transfers?metadata=a:1&metadata=b:2").await;
    assert_eq!(status, 200, "{page}");

    // No operation demands a key of a service without keys.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if let Some(security) = operation["security"].as_array() {
                assert!(
                    security.contains(&json!({})),
                    "{method} {path}: {security:?}"
                );
            }
        }
    }
    app.shutdown().await;
}

/// Every example of a request body (the schema's, and each shape's of a `oneOf`: what Swagger
/// UI's "Try it out" sends, the first one first) is a request a fresh service accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_body_example_is_a_request_the_server_accepts() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (_, doc) = app.get("/openapi.json").await;
    let mut tried = 0;
    // Accounts first, so the transfers' examples find theirs; the capture last, on a hold.
    for (path, schema_name) in [
        ("/accounts", "CreateAccount"),
        ("/transfers", "CreateTransfer"),
        ("/transfers/batch", "CreateBatch"),
        ("/transfers/{id}/capture", "CaptureHold"),
    ] {
        let body = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"];
        assert_eq!(
            referenced(&doc, &body["schema"]),
            schema(&doc, schema_name),
            "{path}"
        );
        let top = schema(&doc, schema_name);
        let mut examples: Vec<&Value> = top["examples"].as_array().unwrap().iter().collect();
        for shape in top["oneOf"].as_array().into_iter().flatten() {
            examples.extend(referenced(&doc, shape)["examples"].as_array().unwrap());
        }
        assert!(!examples.is_empty(), "{schema_name} has no example");
        for (n, example) in examples.into_iter().enumerate() {
            let target = if path.contains("{id}") {
                if n == 0 {
                    app.open_account("bob", 0).await;
                }
                let id = format!("example-hold-{n}");
                let (status, _) = app
                    .post(
                        "/transfers",
                        json!({"id": id, "from": "alice", "to": "bob", "amount": 100, "hold": true}),
                    )
                    .await;
                assert_eq!(status, 201);
                crate::support::wait::eventually("the hold to be pending", || async {
                    app.state(&id).await == "pending"
                })
                .await;
                path.replace("{id}", &id)
            } else {
                path.to_owned()
            };
            let (status, answer) = app.post(&target, example.clone()).await;
            assert!(
                matches!(status, 200 | 201),
                "{path} refuses its example {example}: {status} {answer}"
            );
            if path == "/transfers/batch" {
                assert!(
                    answer["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|i| i["outcome"] == "transfer"),
                    "{answer}"
                );
            }
            tried += 1;
        }
    }
    assert!(tried >= 6, "{tried} examples");
    app.shutdown().await;
}
