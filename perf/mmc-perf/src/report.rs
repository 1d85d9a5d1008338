//! `--report DIR` and `mmc-perf compare`: the JSON figures of a run plus SVG charts drawn by
//! `plotters`, a latency percentile curve (HdrHistogram style: the x axis is 1/(1-q) on a log
//! scale, so 90%, 99%, 99.9% are evenly spaced; latency on a log scale) and throughput and p99
//! over time.
//!
//! `DIR/report.json` holds everything the charts are drawn from (`figures`, `curves`,
//! `timeline`), so `compare` redraws several runs on one chart from their directories.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde_json::{Value, json};

/// Buckets of the throughput / p99 timeline: at most this many, at least 100 ms each.
const MAX_BUCKETS: usize = 120;
const MIN_BUCKET: Duration = Duration::from_millis(100);

/// Completions and latencies per time bucket of the measured window.
#[derive(Clone)]
pub struct Timeline {
    origin: Instant,
    width: Duration,
    counts: Vec<u64>,
    hists: Vec<Option<Histogram<u64>>>,
}

impl Timeline {
    pub fn new(origin: Instant, window: Duration) -> Timeline {
        let n = (window.as_secs_f64() / MIN_BUCKET.as_secs_f64()).ceil() as usize;
        let n = n.clamp(1, MAX_BUCKETS);
        Timeline {
            origin,
            width: window.div_f64(n as f64).max(Duration::from_micros(1)),
            counts: vec![0; n],
            hists: (0..n).map(|_| None).collect(),
        }
    }

    /// A response completed at `t` (clamped into the window) after `us`.
    pub fn record(&mut self, t: Instant, us: u64) {
        let i = (t.saturating_duration_since(self.origin).as_nanos() / self.width.as_nanos())
            .min(self.counts.len() as u128 - 1) as usize;
        self.counts[i] += 1;
        self.hists[i]
            .get_or_insert_with(|| {
                Histogram::new_with_bounds(1, crate::load::HIST_MAX_US, 2).expect("bounds")
            })
            .saturating_record(us.max(1));
    }

    pub fn merge(&mut self, o: &Timeline) {
        for (i, c) in o.counts.iter().enumerate().take(self.counts.len()) {
            self.counts[i] += c;
            if let Some(h) = &o.hists[i] {
                match &mut self.hists[i] {
                    Some(m) => m.add(h).expect("equal bounds"),
                    None => self.hists[i] = Some(h.clone()),
                }
            }
        }
    }

    pub fn json(&self) -> Value {
        let w = self.width.as_secs_f64();
        let t: Vec<f64> = (0..self.counts.len())
            .map(|i| ((i as f64 + 0.5) * w * 1000.0).round() / 1000.0)
            .collect();
        let rps: Vec<f64> = self
            .counts
            .iter()
            .map(|&c| (c as f64 / w * 10.0).round() / 10.0)
            .collect();
        let p99: Vec<Value> = self
            .hists
            .iter()
            .map(|h| match h {
                Some(h) => json!(h.value_at_quantile(0.99)),
                None => Value::Null,
            })
            .collect();
        json!({ "t_s": t, "rps": rps, "p99_us": p99 })
    }
}

/// Points of the percentile curve of `h`: [percentile, µs], from p0 to the largest
/// percentile the sample count resolves, 10 points per decade of 1/(1-q), then the maximum.
pub fn curve(h: &Histogram<u64>) -> Vec<[f64; 2]> {
    let n = h.len();
    if n == 0 {
        return Vec::new();
    }
    let mut pts = Vec::new();
    for i in 0..=70 {
        let x = 10f64.powf(i as f64 / 10.0);
        let q = 1.0 - 1.0 / x;
        if (1.0 - q) * (n as f64) < 1.0 {
            break;
        }
        pts.push([q * 100.0, h.value_at_quantile(q) as f64]);
    }
    let last_q = 100.0 * (1.0 - 1.0 / (n as f64 * 10.0)).max(0.0);
    pts.push([last_q.max(pts.last().map_or(0.0, |p| p[0])), h.max() as f64]);
    pts
}

/// Writes `DIR/report.json`, `DIR/latency.svg` and `DIR/timeline.svg`.
pub fn write(
    dir: &Path,
    figures: &Value,
    curves: &[(String, &Histogram<u64>)],
    timeline: &Timeline,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let curves_json: serde_json::Map<String, Value> = curves
        .iter()
        .map(|(name, h)| (name.clone(), json!(curve(h))))
        .collect();
    let report = json!({
        "figures": figures,
        "curves": curves_json,
        "timeline": timeline.json(),
    });
    let path = dir.join("report.json");
    std::fs::write(&path, format!("{report:#}\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    draw(dir, &[("".to_string(), report)])
}

/// Reads the reports of `dirs` and draws them on one chart each in `out`.
pub fn compare(dirs: &[PathBuf], out: &Path) -> Result<(), String> {
    if dirs.len() < 2 {
        return Err("invalid arguments: compare needs two or more report directories".into());
    }
    let mut runs = Vec::new();
    for d in dirs {
        let path = d.join("report.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a report: {e}", path.display()))?;
        let name = d
            .file_name()
            .map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into());
        runs.push((name, v));
    }
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let summary: Vec<Value> = runs
        .iter()
        .map(|(n, v)| json!({ "run": n, "figures": v["figures"] }))
        .collect();
    std::fs::write(out.join("compare.json"), format!("{:#}\n", json!(summary)))
        .map_err(|e| format!("cannot write compare.json: {e}"))?;
    draw(out, &runs)
}

/// A chart of named lines over one x axis: what the helpers (`memcpy`, `fill`, `drain`,
/// `kv-sub`) report, written as `DIR/<file>` and kept in `report.json` under `charts`.
pub struct LineChart {
    pub file: String,
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    /// A logarithmic x axis (e.g. copy sizes).
    pub log_x: bool,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

impl LineChart {
    fn json(&self) -> Value {
        let series: serde_json::Map<String, Value> = self
            .series
            .iter()
            .map(|(name, pts)| {
                let pts: Vec<[f64; 2]> = pts.iter().map(|&(x, y)| [x, y]).collect();
                (name.clone(), json!(pts))
            })
            .collect();
        json!({
            "file": self.file, "title": self.title, "x": self.x_desc, "y": self.y_desc,
            "log_x": self.log_x, "series": series,
        })
    }

    fn from_json(v: &Value, run: &str) -> Option<LineChart> {
        // Only a plain file name: a report read by `compare` cannot write elsewhere.
        let file = match v["file"].as_str()? {
            f if f.ends_with(".svg") && !f.contains('/') && !f.starts_with('.') => f.to_string(),
            _ => return None,
        };
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        Some(LineChart {
            file,
            title: text("title"),
            x_desc: text("x"),
            y_desc: text("y"),
            log_x: v["log_x"].as_bool().unwrap_or(false),
            series: v["series"]
                .as_object()?
                .iter()
                .map(|(name, pts)| (label(run, name), pairs(pts)))
                .collect(),
        })
    }
}

/// Writes `DIR/report.json` (`figures` and `charts`) and one SVG per chart.
pub fn write_charts(dir: &Path, figures: &Value, charts: &[LineChart]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let report = json!({
        "figures": figures,
        "charts": charts.iter().map(LineChart::json).collect::<Vec<_>>(),
    });
    let path = dir.join("report.json");
    std::fs::write(&path, format!("{report:#}\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    draw(dir, &[("".to_string(), report)])
}

/// Amounts at times (seconds, amount) as a rate over time: per second in buckets of at least
/// 100 ms (at most [`MAX_BUCKETS`]) over `[0, secs]`, each at its bucket's middle.
pub fn rate_over_time(events: &[(f64, f64)], secs: f64) -> Vec<(f64, f64)> {
    let secs = if secs.is_finite() && secs > 0.0 {
        secs
    } else {
        MIN_BUCKET.as_secs_f64()
    };
    let n = ((secs / MIN_BUCKET.as_secs_f64()).ceil() as usize).clamp(1, MAX_BUCKETS);
    let w = secs / n as f64;
    let mut sums = vec![0.0; n];
    for &(t, amount) in events {
        let i = ((t.max(0.0) / w) as usize).min(n - 1);
        sums[i] += amount;
    }
    sums.iter()
        .enumerate()
        .map(|(i, s)| ((i as f64 + 0.5) * w, s / w))
        .collect()
}

/// Draws the line charts of the runs: one file per chart name, every run's series on it.
fn draw_charts(dir: &Path, runs: &[(String, Value)]) -> Result<(), String> {
    let mut charts: Vec<LineChart> = Vec::new();
    for (run, v) in runs {
        for c in v["charts"].as_array().into_iter().flatten() {
            let Some(c) = LineChart::from_json(c, run) else {
                continue;
            };
            match charts.iter_mut().find(|k| k.file == c.file) {
                Some(k) => k.series.extend(c.series),
                None => charts.push(c),
            }
        }
    }
    for c in &charts {
        draw_lines(dir, c)?;
    }
    Ok(())
}

fn draw_lines(dir: &Path, c: &LineChart) -> Result<(), String> {
    let pts = || c.series.iter().flat_map(|s| s.1.iter());
    let (mut xmin, mut xmax) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
        (a.min(p.0), b.max(p.0))
    });
    if !(xmin.is_finite() && xmax.is_finite()) {
        (xmin, xmax) = (0.0, 1.0);
    }
    let ymax = pts().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let ymin = pts().map(|p| p.1).fold(0.0f64, f64::min);
    let path = dir.join(&c.file);
    let root = SVGBackend::new(&path, (960, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(c.title.as_str(), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80);
    // The series, with their legend, on a built chart (linear or log x).
    macro_rules! plot {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(c.x_desc.as_str())
                .y_desc(c.y_desc.as_str())
                .draw()
                .map_err(err)?;
            for (i, (name, pts)) in c.series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            if c.series.iter().any(|s| !s.0.is_empty()) {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(err)?;
            }
        }};
    }
    if c.log_x {
        let lo = xmin.max(1e-9);
        let hi = xmax.max(lo * 2.0);
        plot!(
            builder
                .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), ymin..ymax)
                .map_err(err)?
        );
    } else {
        let hi = if xmax > xmin { xmax } else { xmin + 1.0 };
        plot!(
            builder
                .build_cartesian_2d(xmin..hi, ymin..ymax)
                .map_err(err)?
        );
    }
    root.present().map_err(err)?;
    Ok(())
}

fn pairs(v: &Value) -> Vec<(f64, f64)> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn label(run: &str, series: &str) -> String {
    match (run.is_empty(), series.is_empty()) {
        (true, _) => series.to_string(),
        (false, true) => run.to_string(),
        (false, false) => format!("{run}: {series}"),
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("cannot draw a chart: {e}")
}

/// Draws the charts of reports (run name, report.json) in `dir`: `latency.svg` and
/// `timeline.svg` when they have latency curves and a timeline (load mode, `kvcache`), and
/// each of their line charts (the helpers'), the runs' series on one chart per file.
fn draw(dir: &Path, runs: &[(String, Value)]) -> Result<(), String> {
    let has = |key: &str| {
        runs.iter().any(|(_, v)| match &v[key] {
            Value::Object(m) => !m.is_empty(),
            _ => false,
        })
    };
    if has("curves") {
        draw_latency(dir, runs)?;
    }
    if has("timeline") {
        draw_timeline(dir, runs)?;
    }
    draw_charts(dir, runs)
}

/// `latency.svg`: latency by percentile, every curve of every run.
fn draw_latency(dir: &Path, runs: &[(String, Value)]) -> Result<(), String> {
    // Percentile curves: x = 1/(1-q) (log), y = µs (log).
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (run, v) in runs {
        if let Some(m) = v["curves"].as_object() {
            for (name, pts) in m {
                let pts: Vec<(f64, f64)> = pairs(pts)
                    .into_iter()
                    .map(|(pct, us)| (1.0 / (1.0 - (pct / 100.0).min(0.999_999_9)), us.max(1.0)))
                    .collect();
                if !pts.is_empty() {
                    series.push((label(run, name), pts));
                }
            }
        }
    }
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(10.0f64, f64::max)
        * 1.5;
    let ymin = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(f64::INFINITY, f64::min)
        .min(1e9)
        * 0.8;
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(10.0f64, f64::max)
        * 1.25;
    let ymin = if ymin.is_finite() && ymin < ymax {
        ymin.max(0.5)
    } else {
        1.0
    };
    {
        let path = dir.join("latency.svg");
        let root = SVGBackend::new(&path, (960, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Latency by percentile", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(80)
            .build_cartesian_2d((1.0f64..xmax).log_scale(), (ymin..ymax).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (µs)")
            .x_label_formatter(&|x| {
                let pct = 100.0 * (1.0 - 1.0 / x);
                let s = format!("{pct:.5}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                format!("{s}%")
            })
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(())
}

/// `timeline.svg`: throughput and p99 over the window, every run.
fn draw_timeline(dir: &Path, runs: &[(String, Value)]) -> Result<(), String> {
    // Throughput and p99 over time, one panel each.
    // (run, responses/s, p99 µs) over time.
    type Points = Vec<(f64, f64)>;
    let mut lines: Vec<(String, Points, Points)> = Vec::new();
    for (run, v) in runs {
        let tl = &v["timeline"];
        let t: Vec<f64> = tl["t_s"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        let rps: Vec<(f64, f64)> = t
            .iter()
            .zip(tl["rps"].as_array().into_iter().flatten())
            .filter_map(|(t, r)| Some((*t, r.as_f64()?)))
            .collect();
        let p99: Vec<(f64, f64)> = t
            .iter()
            .zip(tl["p99_us"].as_array().into_iter().flatten())
            .filter_map(|(t, r)| Some((*t, r.as_f64()?)))
            .collect();
        lines.push((label(run, ""), rps, p99));
    }
    let tmax = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.0))
        .fold(0.1f64, f64::max)
        * 1.05;
    let path = dir.join("timeline.svg");
    let root = SVGBackend::new(&path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(360);
    for (panel, area, pick) in [
        ("Throughput (responses/s)", &top, 1usize),
        ("p99 latency (µs)", &bottom, 2usize),
    ] {
        let ymax = lines
            .iter()
            .flat_map(|l| if pick == 1 { &l.1 } else { &l.2 }.iter().map(|p| p.1))
            .fold(1.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(panel, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(36)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0f64..tmax, 0.0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time in the measured window (s)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(err)?;
        for (i, l) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts = if pick == 1 { &l.1 } else { &l.2 };
            let s = chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?;
            if !l.0.is_empty() {
                s.label(l.0.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
        }
        if lines.iter().any(|l| !l.0.is_empty()) {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed SVG document with drawn lines (plotters writes polylines).
    fn assert_svg(path: &Path, must_contain: &[&str]) {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t = text.trim();
        assert!(
            t.starts_with("<svg") || t.starts_with("<?xml"),
            "{}",
            path.display()
        );
        assert!(t.ends_with("</svg>"), "{}", path.display());
        assert!(t.contains("<polyline"), "{} has no line", path.display());
        for s in must_contain {
            assert!(t.contains(s), "{} lacks {s}", path.display());
        }
        // Every element opened is closed (a rough well-formedness check).
        let opened = t.matches("<svg").count();
        assert_eq!(opened, t.matches("</svg>").count());
    }

    fn sample_run(dir: &Path, scale: u64) {
        let mut h = crate::load::new_histogram();
        let origin = Instant::now();
        let mut tl = Timeline::new(origin, Duration::from_secs(2));
        for i in 0..10_000u64 {
            let us = scale * (50 + i % 100) + if i % 500 == 0 { 20_000 } else { 0 };
            h.record(us).unwrap();
            tl.record(origin + Duration::from_micros(i * 200), us);
        }
        write(
            dir,
            &json!({"requests": 10_000}),
            &[("latency".into(), &h)],
            &tl,
        )
        .unwrap();
    }

    #[test]
    fn report_and_compare_write_json_and_svg_charts() {
        let base = std::env::temp_dir().join(format!("mmc-perf-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (a, b, out) = (base.join("run-a"), base.join("run-b"), base.join("cmp"));
        sample_run(&a, 1);
        sample_run(&b, 3);
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(a.join("report.json")).unwrap()).unwrap();
        assert_eq!(v["figures"]["requests"], 10_000);
        let pts = v["curves"]["latency"].as_array().unwrap();
        assert!(pts.len() > 20, "{pts:?}");
        assert_eq!(v["timeline"]["t_s"].as_array().unwrap().len(), 20);
        assert!(
            v["timeline"]["rps"][0].as_f64().unwrap() > 4000.0,
            "{}",
            v["timeline"]
        );
        assert_svg(&a.join("latency.svg"), &["99%", "latency"]);
        assert_svg(&a.join("timeline.svg"), &["Throughput"]);
        compare(&[a.clone(), b.clone()], &out).unwrap();
        assert_svg(&out.join("latency.svg"), &["run-a", "run-b"]);
        assert_svg(&out.join("timeline.svg"), &["run-a", "run-b"]);
        assert!(out.join("compare.json").exists());
        assert!(
            compare(std::slice::from_ref(&a), &out).is_err(),
            "one run is no comparison"
        );
        assert!(compare(&[a, base.join("missing")], &out).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn rates_over_time_per_bucket() {
        // 1 s in 10 buckets of 100 ms: 5 at 0.05 s, 3 at 0.95 s (and one past the end, kept in
        // the last bucket).
        let r = rate_over_time(&[(0.05, 2.0), (0.06, 3.0), (0.95, 1.0), (1.5, 2.0)], 1.0);
        assert_eq!(r.len(), 10);
        assert!(
            (r[0].0 - 0.05).abs() < 1e-9 && (r[0].1 - 50.0).abs() < 1e-9,
            "{r:?}"
        );
        assert!((r[9].1 - 30.0).abs() < 1e-9, "{r:?}");
        assert!(r[1..9].iter().all(|p| p.1 == 0.0), "{r:?}");
        // Long runs: at most MAX_BUCKETS buckets.
        assert_eq!(rate_over_time(&[], 3600.0).len(), MAX_BUCKETS);
        assert_eq!(rate_over_time(&[(0.0, 1.0)], 0.0).len(), 1);
    }

    #[test]
    fn line_charts_are_written_and_compared() {
        let base = std::env::temp_dir().join(format!("mmc-perf-lines-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (a, b, out) = (base.join("one"), base.join("two"), base.join("cmp"));
        for (dir, k) in [(&a, 1.0), (&b, 2.0)] {
            let chart = LineChart {
                file: "bw.svg".into(),
                title: "Bandwidth".into(),
                x_desc: "size".into(),
                y_desc: "GB/s".into(),
                log_x: true,
                series: vec![("hot".into(), vec![(4096.0, k), (65536.0, 2.0 * k)])],
            };
            write_charts(dir, &json!({"k": k}), &[chart]).unwrap();
            assert_svg(&dir.join("bw.svg"), &["Bandwidth", "hot"]);
            assert!(!dir.join("latency.svg").exists(), "no latencies, no curve");
        }
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(a.join("report.json")).unwrap()).unwrap();
        assert_eq!(v["figures"]["k"], 1.0);
        assert_eq!(v["charts"][0]["series"]["hot"][1][1], 2.0);
        compare(&[a.clone(), b.clone()], &out).unwrap();
        assert_svg(&out.join("bw.svg"), &["one: hot", "two: hot"]);
        // A report naming a file outside its directory is not drawn there.
        let mut evil = v.clone();
        evil["charts"][0]["file"] = json!("../evil.svg");
        assert!(LineChart::from_json(&evil["charts"][0], "x").is_none());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn curve_is_monotone_and_ends_at_max() {
        let mut h = crate::load::new_histogram();
        for v in 1..=1000u64 {
            h.record(v).unwrap();
        }
        let c = curve(&h);
        assert!(
            c.windows(2)
                .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1]),
            "{c:?}"
        );
        assert_eq!(c.last().unwrap()[1], h.max() as f64);
        assert!(curve(&crate::load::new_histogram()).is_empty());
    }
}
