//! The operator kit in `deploy/` cannot drift from the service: every PromQL expression of the
//! Grafana dashboard and of the Prometheus alert rules is parsed by a PromQL parser, and every
//! metric it selects, every label it matches on and every label it groups by must be in the
//! `/metrics` of a running service. Prometheus's own target labels (`instance`, `job`) are the
//! only names allowed that the service does not export.
//!
//! The alert rules' behaviour is unit-tested by `promtool test rules deploy/alerts-tests.yml`
//! (`.ci/run`); here we check that every alert has a case where it fires and one where it
//! does not.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::Matchers;
use promql_parser::parser::{self, Expr, LabelModifier};
use serde_json::{json, Value};
use yaml_rust2::YamlLoader;

use transfer_service::store::elasticsearch::Secret;

use crate::support::app::{Backend, TestApp};
use crate::support::metrics::Exposition;
use crate::support::receiver::{Receiver, SECRET};
use crate::support::wait;

const DASHBOARD: &str = include_str!("../../deploy/grafana/dashboards/transfer-service.json");
const ALERTS: &str = include_str!("../../deploy/alerts.yml");
const ALERT_TESTS: &str = include_str!("../../deploy/alerts-tests.yml");

/// Labels Prometheus attaches to every scraped series; the service never exports them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// One PromQL expression of the kit and where it is.
#[derive(Debug)]
struct Query {
    origin: String,
    promql: String,
}

/// What one expression needs from `/metrics`.
#[derive(Debug, Default)]
struct Needs {
    /// Selected metric name → label names its matchers use.
    selectors: BTreeMap<String, BTreeSet<String>>,
    /// Label names of `by`, `without`, `on` and `ignoring` clauses.
    grouping: BTreeSet<String>,
}

impl Needs {
    fn of(promql: &str) -> Result<Needs, String> {
        let expr = parser::parse(promql)?;
        let mut needs = Needs::default();
        needs.walk(&expr);
        if needs.selectors.is_empty() {
            return Err("selects no metric".into());
        }
        Ok(needs)
    }

    fn walk(&mut self, expr: &Expr) {
        match expr {
            Expr::Aggregate(e) => {
                self.group(e.modifier.as_ref());
                self.walk(&e.expr);
                if let Some(param) = &e.param {
                    self.walk(param);
                }
            }
            Expr::Unary(e) => self.walk(&e.expr),
            Expr::Binary(e) => {
                self.group(e.modifier.as_ref().and_then(|m| m.matching.as_ref()));
                self.walk(&e.lhs);
                self.walk(&e.rhs);
            }
            Expr::Paren(e) => self.walk(&e.expr),
            Expr::Subquery(e) => self.walk(&e.expr),
            Expr::VectorSelector(vs) => self.select(vs.name.as_deref(), &vs.matchers),
            Expr::MatrixSelector(ms) => self.select(ms.vs.name.as_deref(), &ms.vs.matchers),
            Expr::Call(call) => call.args.args.iter().for_each(|arg| self.walk(arg)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }

    fn group(&mut self, modifier: Option<&LabelModifier>) {
        if let Some(modifier) = modifier {
            self.grouping
                .extend(modifier.labels().labels.iter().cloned());
        }
    }

    fn select(&mut self, name: Option<&str>, matchers: &Matchers) {
        let by_name = matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__")
            .map(|m| m.value.as_str());
        let name = name.or(by_name).unwrap_or("<no name>").to_owned();
        let labels = matchers
            .matchers
            .iter()
            .chain(matchers.or_matchers.iter().flatten())
            .map(|m| m.name.clone())
            .filter(|l| l != "__name__");
        self.selectors.entry(name).or_default().extend(labels);
    }
}

/// Grafana's variables replaced by what Prometheus would receive: its interval variables
/// (`$__rate_interval`, `$__range`, ...) by a duration, the dashboard's own (`$instance`,
/// always inside a label matcher) by a regex.
fn substitute_grafana_variables(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&n) = chars.peek() {
            if n.is_ascii_alphanumeric() || n == '_' {
                name.push(n);
                chars.next();
            } else {
                break;
            }
        }
        if braced {
            assert_eq!(chars.next(), Some('}'), "unterminated ${{...}} in {expr}");
        }
        out.push_str(if name.starts_with("__") { "5m" } else { ".*" });
    }
    out
}

/// Every `expr` of the dashboard's panels, and the metric of every `label_values(metric,
/// label)` variable (as a selector with that label).
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    fn targets(value: &Value, path: &str, out: &mut Vec<Query>) {
        match value {
            Value::Object(object) => {
                let title = object.get("title").and_then(Value::as_str);
                let here = title.map_or(path.to_owned(), |t| format!("{path} / {t}"));
                if let Some(Value::String(expr)) = object.get("expr") {
                    out.push(Query {
                        origin: format!("dashboard{here}"),
                        promql: substitute_grafana_variables(expr),
                    });
                }
                object.values().for_each(|v| targets(v, &here, out));
            }
            Value::Array(items) => items.iter().for_each(|v| targets(v, path, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    targets(&dashboard["panels"], "", &mut queries);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        let args = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("unexpected variable query {definition}"));
        let (metric, label) = args.split_once(',').expect("label_values(metric, label)");
        queries.push(Query {
            origin: format!("dashboard variable {}", variable["name"]),
            promql: format!("{}{{{}=~\".+\"}}", metric.trim(), label.trim()),
        });
    }
    queries
}

/// Every `expr` of every rule of a Prometheus rules file.
fn rule_queries(rules: &str) -> Vec<Query> {
    let docs = YamlLoader::load_from_str(rules).expect("the rules file is YAML");
    let mut queries = Vec::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("a named rule");
            let expr = rule["expr"].as_str().expect("an expr");
            queries.push(Query {
                origin: format!("rule {name}"),
                promql: expr.to_owned(),
            });
        }
    }
    queries
}

/// What each query needs that `/metrics` lacks, one line per problem (empty: all good).
fn missing_from(exposition: &Exposition, queries: &[Query]) -> Vec<String> {
    let mut labels_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for sample in &exposition.samples {
        labels_of
            .entry(sample.name.as_str())
            .or_default()
            .extend(sample.labels.keys().map(String::as_str));
    }
    let mut problems = Vec::new();
    for query in queries {
        let needs = match Needs::of(&query.promql) {
            Ok(needs) => needs,
            Err(e) => {
                problems.push(format!(
                    "{}: not valid PromQL ({e}): {}",
                    query.origin, query.promql
                ));
                continue;
            }
        };
        let mut selected_labels = BTreeSet::new();
        for (metric, labels) in &needs.selectors {
            let Some(exported) = labels_of.get(metric.as_str()) else {
                problems.push(format!("{}: metric {metric} is not exported", query.origin));
                continue;
            };
            selected_labels.extend(exported.iter().copied());
            for label in labels {
                if !exported.contains(label.as_str()) && !TARGET_LABELS.contains(&label.as_str()) {
                    problems.push(format!("{}: {metric} has no label {label}", query.origin));
                }
            }
        }
        for label in &needs.grouping {
            if !selected_labels.contains(label.as_str()) && !TARGET_LABELS.contains(&label.as_str())
            {
                problems.push(format!(
                    "{}: groups by {label}, which no metric it selects has",
                    query.origin
                ));
            }
        }
    }
    problems
}

/// `/metrics` of a service that has served a transfer and delivered its webhook (labelled
/// families appear with their first label set: store requests, HTTP requests, receivers).
async fn exposition_of_a_busy_service() -> Exposition {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.webhooks.webhook_url = vec![url];
        config.webhooks.webhook_secret = Some(Secret::new(SECRET));
    })
    .await;
    app.open_accounts([("alice", 100), ("bob", 0)]).await;
    app.transfer_accepted("t-1", "alice", "bob", 10).await;
    app.settled("t-1").await;
    // The dispatcher records a delivery a moment after the receiver has answered it.
    wait::eventually("the webhook's delivery to be recorded", || async {
        receiver.delivered_ids().contains("t-1/transfer.finished")
            && app.scrape().await.sum("webhook_delivery_lag_seconds_count") >= 1.0
    })
    .await;
    let exposition = app.scrape().await;
    app.shutdown().await;
    exposition
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_of_the_dashboard_and_alerts_is_exported() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = dashboard_queries(&dashboard);
    let panels = queries.len();
    queries.extend(rule_queries(ALERTS));
    assert!(panels >= 15, "only {panels} dashboard queries found");
    assert!(queries.len() > panels, "no alert rule found");

    let exposition = exposition_of_a_busy_service().await;
    let problems = missing_from(&exposition, &queries);
    assert!(
        problems.is_empty(),
        "the operator kit in deploy/ names what the service does not export:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_finds_an_unknown_metric_a_wrong_label_and_bad_promql() {
    let exposition = Exposition::parse(
        "# TYPE store_requests_total counter\n\
         store_requests_total{op=\"get\",outcome=\"ok\"} 3\n",
    );
    let query = |promql: &str| Query {
        origin: "test".into(),
        promql: promql.into(),
    };
    let problems = missing_from(
        &exposition,
        &[
            query("sum by (op) (rate(store_requests_total{instance=\"a\"}[5m]))"),
            query("rate(transfers_teleported_total[5m])"),
            query("store_requests_total{outcom=\"ok\"}"),
            query("sum by (route) (store_requests_total)"),
            query("sum(rate(store_requests_total[5m])"),
            query("vector(1)"),
        ],
    );
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert!(problems[0].contains("transfers_teleported_total is not exported"));
    assert!(problems[1].contains("has no label outcom"));
    assert!(problems[2].contains("groups by route"));
    assert!(problems[3].contains("not valid PromQL"));
    assert!(problems[4].contains("selects no metric"));
}

#[test]
fn grafana_variables_become_what_prometheus_receives() {
    assert_eq!(
        substitute_grafana_variables(
            "rate(x{instance=~\"$instance\"}[$__rate_interval]) + increase(x[${__range}])"
        ),
        "rate(x{instance=~\".*\"}[5m]) + increase(x[5m])"
    );
    let dashboard = json!({
        "panels": [{"title": "p", "targets": [{"expr": "up"}]}],
        "templating": {"list": [{"name": "instance", "definition": "label_values(m, instance)"}]},
    });
    let queries = dashboard_queries(&dashboard);
    assert_eq!(queries.len(), 2, "{queries:?}");
    assert_eq!(queries[1].promql, "m{instance=~\".+\"}");
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_promtool_case() {
    let alerts: BTreeSet<String> = rule_queries(ALERTS)
        .into_iter()
        .filter_map(|q| q.origin.strip_prefix("rule ").map(str::to_owned))
        .collect();
    let docs = YamlLoader::load_from_str(ALERT_TESTS).expect("the tests file is YAML");
    assert_eq!(
        docs[0]["rule_files"][0].as_str(),
        Some("alerts.yml"),
        "alerts-tests.yml must test alerts.yml"
    );
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for case in docs[0]["tests"].as_vec().expect("tests") {
        for check in case["alert_rule_test"].as_vec().into_iter().flatten() {
            let name = check["alertname"].as_str().expect("alertname").to_owned();
            let expected = check["exp_alerts"].as_vec().map_or(0, Vec::len);
            assert!(alerts.contains(&name), "a test of unknown alert {name}");
            if expected > 0 {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let untested = |seen: &BTreeSet<String>| -> Vec<&String> {
        alerts.iter().filter(|a| !seen.contains(*a)).collect()
    };
    assert!(alerts.len() >= 6, "{alerts:?}");
    assert!(
        untested(&fires).is_empty(),
        "never firing: {:?}",
        untested(&fires)
    );
    assert!(
        untested(&quiet).is_empty(),
        "never quiet: {:?}",
        untested(&quiet)
    );
}

/// `docker compose up` starts the Elasticsearch the tests run (`tools/es-cluster`), not an
/// older one.
#[test]
fn docker_compose_runs_the_elasticsearch_the_tests_run() {
    let compose = include_str!("../../docker-compose.yml");
    let pom = include_str!("../../tools/es-cluster/pom.xml");
    let tested = pom
        .split("<elasticsearch.version>")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("tools/es-cluster/pom.xml names its Elasticsearch version");
    let image = "docker.elastic.co/elasticsearch/elasticsearch:";
    let composed = compose
        .lines()
        .find_map(|line| line.trim().strip_prefix("image: ")?.strip_prefix(image))
        .expect("docker-compose.yml has an Elasticsearch image");
    assert_eq!(composed, tested, "docker-compose.yml's Elasticsearch");
}
