//! `/metrics` as the tests read it: the Prometheus text exposition format parsed by
//! `openmetrics-parser` (a maintained parser that follows the format: escaped label values,
//! `+Inf`/`-Inf`/`NaN`, histograms and summaries grouped by family, and an error on any line
//! that is not the format), then flattened back into the series a Prometheus query names
//! (`x_bucket{le="…"}`, `x_sum`, `x_count`), so an assertion reads like the exposition.

use std::collections::BTreeMap;

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricNumber, PrometheusType, PrometheusValue};

/// One series and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    /// `# TYPE name kind`, by family name.
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Parses a whole exposition; panics, with the parser's error, if it is not one.
    pub fn parse(text: &str) -> Self {
        let parsed = parse_prometheus(text)
            .unwrap_or_else(|e| panic!("/metrics is not the text format: {e:?}\n{text}"));
        let mut exposition = Exposition::default();
        for (name, family) in &parsed.families {
            exposition
                .types
                .insert(name.clone(), type_name(&family.family_type).to_owned());
            for sample in family.iter_samples() {
                let labels: BTreeMap<String, String> = sample
                    .get_labelset()
                    .unwrap_or_else(|e| panic!("labels of {name}: {e:?}"))
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                exposition.push_flattened(name, labels, &sample.value);
            }
        }
        exposition
    }

    fn push_flattened(
        &mut self,
        name: &str,
        labels: BTreeMap<String, String>,
        value: &PrometheusValue,
    ) {
        let mut push = |suffix: &str, labels: BTreeMap<String, String>, value: f64| {
            self.samples.push(Sample {
                name: format!("{name}{suffix}"),
                labels,
                value,
            })
        };
        // A histogram's buckets and a summary's quantiles: one sample each, labelled with its
        // bound, then their sum and count.
        let mut bounded = |suffix: &str, label: &str, upper: f64, value: f64| {
            let mut with_bound = labels.clone();
            with_bound.insert(label.into(), bound(upper));
            push(suffix, with_bound, value);
        };
        let (sum, count) = match value {
            PrometheusValue::Unknown(n) | PrometheusValue::Gauge(n) => {
                push("", labels, n.as_f64());
                return;
            }
            PrometheusValue::Counter(c) => {
                push("", labels, c.value.as_f64());
                return;
            }
            PrometheusValue::Histogram(h) => {
                for bucket in &h.buckets {
                    bounded("_bucket", "le", bucket.upper_bound, bucket.count.as_f64());
                }
                (h.sum.map(|sum| sum.as_f64()), h.count)
            }
            PrometheusValue::Summary(s) => {
                for quantile in &s.quantiles {
                    bounded("", "quantile", quantile.quantile, quantile.value.as_f64());
                }
                (s.sum.map(|sum| sum.as_f64()), s.count)
            }
        };
        if let Some(sum) = sum {
            push("_sum", labels.clone(), sum);
        }
        if let Some(count) = count {
            push("_count", labels, count as f64);
        }
    }

    /// The value of the one sample with exactly these labels; panics if there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}; have {:#?}", self.named(name)))
    }

    /// `store_requests_total` of the store operation `op` that ended as `outcome`; panics if
    /// there is no such sample.
    pub fn store_requests(&self, op: &str, outcome: &str) -> f64 {
        self.value("store_requests_total", &[("op", op), ("outcome", outcome)])
    }

    /// The value of the one sample with exactly these labels, if there is one.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut found = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == wanted);
        let sample = found.next()?;
        assert!(found.next().is_none(), "{name}{labels:?} appears twice");
        Some(sample.value)
    }

    /// Every sample of `name`, whatever its labels.
    pub fn named(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// The sum over every sample of `name` (every label set).
    pub fn sum(&self, name: &str) -> f64 {
        self.named(name).iter().map(|s| s.value).sum()
    }
}

fn type_name(kind: &PrometheusType) -> &'static str {
    match kind {
        PrometheusType::Counter => "counter",
        PrometheusType::Gauge => "gauge",
        PrometheusType::Histogram => "histogram",
        PrometheusType::Summary => "summary",
        PrometheusType::Unknown => "untyped",
    }
}

/// A bucket bound or quantile as the exposition writes it (`+Inf`, `0.5`).
fn bound(value: f64) -> String {
    match value {
        f64::INFINITY => "+Inf".to_owned(),
        f64::NEG_INFINITY => "-Inf".to_owned(),
        v => MetricNumber::Float(v).to_string(),
    }
}
