//! `--shard-series 1,2,4,8`: the benchmark at each shard count on es-emulator's capacity
//! model, and how the rate scales with the shards (`docs/benchmark.md`, "Shards on the
//! capacity model").
//!
//! Each run is a whole benchmark: a fresh emulator with `--shard-op-cost`, a fresh service
//! with `ELASTICSEARCH_SHARDS` set to the count, the load, the healthz phase. The counts are
//! interleaved (`--runs 3`: the series, then again, then again), so that a drift of the
//! machine falls on every count alike. The table gives at each count the median rate with
//! its min and max, its ratio to the first count's median, whether that meets the goal (at
//! N shards at least 0.8 × N times the rate at one), and where the CPU went: the service's
//! a transfer and in cores (its CPU over the phase's wall time), this process's, the
//! clients and the emulator, which share the machine with it, and the whole machine's; then
//! how busy the model's shards were and how many requests the emulator had in flight.

use super::*;

/// The runs at one shard count.
#[derive(Serialize)]
struct Point {
    shards: u32,
    runs: Vec<Report>,
}

/// Runs the series and prints its table (or, with `--json`, every run's report and the
/// table's figures).
pub fn run(args: &Args, counts: &[u32]) {
    let mut points: Vec<Point> = (counts.iter())
        .map(|&shards| Point {
            shards,
            runs: Vec::new(),
        })
        .collect();
    for round in 1..=args.runs {
        for point in &mut points {
            let mut at = args.clone();
            at.shards = Some(point.shards);
            at.shard_series = None;
            eprintln!(
                "shard series: {} shards, run {round} of {}",
                point.shards, args.runs
            );
            let report = measure(&at);
            let wanted = point.shards as usize;
            assert_eq!(
                report.index_shard_counts(),
                Some(vec![wanted, wanted]),
                "the data indices do not have ELASTICSEARCH_SHARDS={wanted} primaries: \
                 does the service read it?"
            );
            eprintln!("  {:.0} transfers/s", report.transfers_per_s);
            point.runs.push(report);
        }
    }
    let rows = summarize(&points);
    if args.json {
        let out = serde_json::json!({"series": rows, "points": points});
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
    } else {
        print_table(args, &rows);
    }
}

/// One line of the table: the figures of one shard count, over its runs.
#[derive(Serialize)]
struct Row {
    shards: u32,
    runs: usize,
    transfers_per_s: Spread,
    /// The median rate over the first count's median rate.
    ratio_to_first: f64,
    /// The goal at this count: `ratio_to_first ≥ 0.8 × shards / first shards`.
    meets_goal: bool,
    service_cpu_us_per_transfer: Option<f64>,
    /// The service's CPU over the transfer phase's wall time.
    service_cores: Option<f64>,
    /// This process's (clients and emulator) likewise.
    bench_cores: Option<f64>,
    /// Every process's on the machine likewise.
    machine_cores: Option<f64>,
    es_requests_per_transfer: Option<f64>,
    /// How busy the data indices' shards were in the capacity model.
    shard_busy: Option<f64>,
    /// The emulator's requests in flight on average.
    engine_requests_in_flight: Option<f64>,
    post_p50_ms: Option<f64>,
    failed: u64,
}

/// Median, min and max of one figure over the runs.
#[derive(Serialize, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().collect();
        values.sort_by(f64::total_cmp);
        let (first, last) = (*values.first()?, *values.last()?);
        Some(Spread {
            median: median_of_sorted(&values),
            min: first,
            max: last,
        })
    }
}

/// The median of sorted values (the mean of the middle two for an even count).
fn median_of_sorted(values: &[f64]) -> f64 {
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

fn median(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let values: Option<Vec<f64>> = values.into_iter().collect();
    Spread::of(values?).map(|s| s.median)
}

fn summarize(points: &[Point]) -> Vec<Row> {
    let rates = |p: &Point| Spread::of(p.runs.iter().map(|r| r.transfers_per_s));
    let Some((first_shards, first_rate)) =
        (points.first()).and_then(|p| Some((p.shards, rates(p)?.median)))
    else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for point in points {
        let Some(rate) = rates(point) else { continue };
        let ratio = rate.median / first_rate;
        let cores = |cpu: fn(&Report) -> Option<f64>| {
            median((point.runs.iter()).map(|r| cpu(r).map(|us| us * r.transfers_per_s / 1e6)))
        };
        rows.push(Row {
            shards: point.shards,
            runs: point.runs.len(),
            transfers_per_s: rate,
            ratio_to_first: ratio,
            meets_goal: ratio >= 0.8 * f64::from(point.shards) / f64::from(first_shards),
            service_cpu_us_per_transfer: median(
                point.runs.iter().map(|r| r.service_cpu_us_per_transfer),
            ),
            service_cores: cores(|r| r.service_cpu_us_per_transfer),
            bench_cores: cores(|r| r.bench_cpu_us_per_transfer),
            machine_cores: median(point.runs.iter().map(|r| r.machine_cores)),
            es_requests_per_transfer: median(
                point.runs.iter().map(|r| r.es_http_requests_per_transfer),
            ),
            shard_busy: median(point.runs.iter().map(|r| r.shard_busy)),
            engine_requests_in_flight: median(
                point.runs.iter().map(|r| r.engine_requests_in_flight),
            ),
            post_p50_ms: median(point.runs.iter().map(|r| r.post_latency_ms.p50)),
            failed: point.runs.iter().map(|r| r.failed).sum(),
        });
    }
    rows
}

fn print_table(args: &Args, rows: &[Row]) {
    let cost = args
        .shard_op_cost
        .map_or("off".into(), |c| format!("{} µs", c.as_micros()));
    println!(
        "shard series: {} clients, {} accounts, {} s each, shard op cost {cost}, medians of {} run(s)",
        args.clients(),
        args.accounts,
        args.duration.as_secs_f64(),
        args.runs
    );
    let shown = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let header = [
        "shards",
        "transfers/s (min–max)",
        "ratio",
        "goal",
        "service µs/transfer",
        "service cores",
        "bench cores",
        "machine cores",
        "ES req/transfer",
        "shards busy",
        "ES req in flight",
        "POST p50 ms",
        "failed",
    ];
    let lines: Vec<[String; 13]> = (rows.iter())
        .map(|row| {
            let rate = row.transfers_per_s;
            [
                row.shards.to_string(),
                format!("{:.0} ({:.0}–{:.0})", rate.median, rate.min, rate.max),
                format!("{:.2}", row.ratio_to_first),
                if row.meets_goal { "met" } else { "not met" }.to_owned(),
                shown(row.service_cpu_us_per_transfer, 0),
                shown(row.service_cores, 2),
                shown(row.bench_cores, 2),
                shown(row.machine_cores, 2),
                shown(row.es_requests_per_transfer, 2),
                shown(row.shard_busy.map(|b| b * 100.0), 0) + " %",
                shown(row.engine_requests_in_flight, 2),
                shown(row.post_p50_ms, 1),
                row.failed.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            (lines.iter().map(|l| l[i].chars().count()))
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = (cells.iter().zip(&widths))
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for cells in &lines {
        line(cells.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let spread = Spread::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((spread.median, spread.min, spread.max), (2.5, 1.0, 4.0));
        assert_eq!(Spread::of([5.0, 1.0, 3.0]).unwrap().median, 3.0);
        assert!(Spread::of([]).is_none());
        assert_eq!(median([Some(1.0), None]), None);
    }
}
