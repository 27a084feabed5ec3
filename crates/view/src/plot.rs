//! `longhaul plot`: a run's intervals drawn to SVG or PNG (a matrix run's
//! cells: [`matrix`]).
//!
//! One figure, top to bottom:
//!
//! - the title: run id, kind, hosts in the order the data went (with the
//!   way: client to server, server to client, both), date (UTC), mean rate
//!   (and the status when the run did not end `ok`);
//! - the legend: the lines (each stream by number, up to ten) and bars,
//!   then each limit's colour;
//! - a strip per direction, each interval coloured by what limited it, so
//!   one sees where the limit changed;
//! - throughput per interval: a thin line per stream (numbered `#N` at
//!   its end), a thick line for
//!   each direction's total (summed from its streams when the run kept
//!   no total row);
//! - retransmits per interval (bars) and the RTT (a line, right axis),
//!   when the run has them;
//! - the streams carrying chunks (cp, sync), when the run has them.
//!
//! Intervals inside `--omit` are shaded grey in every panel. Text is laid
//! out (and, in a PNG, drawn) with DejaVu Sans embedded in the binary, so a
//! host without fonts draws the same figure; an SVG names the family
//! (`sans-serif`) and lets its viewer pick the face.

pub mod matrix;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use longhaul_archive::model::{IntervalRow, RunDetail};
use longhaul_proto::units::format_rate;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The figure's size in pixels (the SVG's user units).
pub const WIDTH: u32 = 1400;
pub const HEIGHT: u32 = 900;

/// DejaVu Sans (Bitstream Vera license; `assets/fonts/README.md`).
static FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Pixels left and right of every panel's plotting area (the axis labels):
/// the same in every panel, so their time axes line up.
const LEFT: u32 = 84;
const RIGHT: u32 = 84;
const MARGIN: u32 = 12;
/// Retransmits are bars up to this many intervals, a line beyond.
const MAX_BARS: usize = 300;

/// What can go wrong drawing a run.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "run {0} has no intervals to plot (a doctor or bench disk run keeps none); nor does a copy or test that ended within its first interval"
    )]
    NoIntervals(i64),
    #[error("run {0} is a matrix that kept no cells to plot (it ended before its first cell)")]
    NoCells(i64),
    #[error("cannot plot to {path}: {why}; name the file .svg or .png")]
    Format { path: PathBuf, why: String },
    #[error("cannot write {path}: {why}")]
    Write { path: PathBuf, why: String },
    #[error("the embedded font could not be loaded")]
    Font,
    #[error("drawing the plot failed: {0}")]
    Draw(String),
}

/// The file formats `plot` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// The format a file's extension asks for (`.svg` or `.png`, any case).
pub fn format_of(path: &Path) -> Result<Format, PlotError> {
    let ext = path.extension().map(|e| e.to_string_lossy().to_lowercase());
    match ext.as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        Some(other) => Err(PlotError::Format {
            path: path.to_path_buf(),
            why: format!("the extension .{other} is not a format plot writes"),
        }),
        None => Err(PlotError::Format {
            path: path.to_path_buf(),
            why: "the name has no extension to tell the format".into(),
        }),
    }
}

/// How much a plot shows: distinct intervals, and streams (the stream
/// lines drawn, or for a run that kept only totals the most streams
/// active at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub intervals: usize,
    pub streams: usize,
}

/// What [`render`] and [`svg_string`] draw of `detail`.
pub fn counts(detail: &RunDetail) -> Counts {
    let rows = detail.intervals.iter().filter(|r| usable(r));
    let intervals = rows.clone().map(|r| r.idx).collect::<BTreeSet<_>>().len();
    let lines = rows
        .clone()
        .filter(|r| r.stream >= 0)
        .map(|r| (r.direction.as_str(), r.stream))
        .collect::<BTreeSet<_>>()
        .len();
    let streams = if lines > 0 {
        lines
    } else {
        rows.filter_map(|r| r.streams).max().unwrap_or(0) as usize
    };
    Counts { intervals, streams }
}

/// Draws `detail` to `out`: SVG or PNG by its extension.
pub fn render(detail: &RunDetail, out: &Path) -> Result<(), PlotError> {
    let format = format_of(out)?;
    let model = Model::of(detail)?;
    let write_error = |e: std::io::Error| PlotError::Write {
        path: out.to_path_buf(),
        why: e.to_string(),
    };
    match format {
        Format::Svg => {
            let svg = svg_of(&model)?;
            std::fs::write(out, svg).map_err(write_error)
        }
        Format::Png => {
            register_font()?;
            // Made here first, so that an unwritable place is told as such
            // and not as the image encoder's error after the drawing.
            std::fs::File::create(out).map_err(write_error)?;
            let root = BitMapBackend::new(out, (WIDTH, HEIGHT)).into_drawing_area();
            draw(&root, &model)?;
            root.present().map_err(|e| PlotError::Write {
                path: out.to_path_buf(),
                why: e.to_string(),
            })
        }
    }
}

/// The SVG of `detail`, as [`render`] writes it (for the dashboard to embed).
pub fn svg_string(detail: &RunDetail) -> Result<String, PlotError> {
    svg_of(&Model::of(detail)?)
}

fn svg_of(model: &Model) -> Result<String, PlotError> {
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, model)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// The embedded face, registered once for the whole process: the layout
/// (both formats) measures text with it and a PNG draws with it.
fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

fn draw_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// A row that can be drawn: finite times in order.
fn usable(r: &IntervalRow) -> bool {
    r.start_s.is_finite() && r.end_s.is_finite() && r.end_s >= r.start_s
}

fn finite_or_zero(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v
    } else {
        0.0
    }
}

/// One interval as drawn.
#[derive(Debug, Clone)]
struct Sample {
    start: f64,
    end: f64,
    bps: f64,
    bytes: u64,
    retransmits: Option<u64>,
    rtt_us: Option<u32>,
    streams: Option<u32>,
    limit: Option<String>,
    omitted: bool,
}

impl Sample {
    fn of(r: &IntervalRow) -> Sample {
        Sample {
            start: r.start_s,
            end: r.end_s,
            bps: finite_or_zero(r.bits_per_second),
            bytes: r.bytes,
            retransmits: r.retransmits,
            rtt_us: r.rtt_us,
            streams: r.streams,
            limit: r.limit.clone().filter(|l| !l.is_empty()),
            omitted: r.omitted,
        }
    }

    fn mid(&self) -> f64 {
        (self.start + self.end) / 2.0
    }

    /// A direction's total for one interval, from its streams' rows.
    fn sum(rows: &[&IntervalRow]) -> Sample {
        let rtts: Vec<u64> = rows
            .iter()
            .filter_map(|r| r.rtt_us)
            .map(u64::from)
            .collect();
        let mut limits: BTreeMap<&str, usize> = BTreeMap::new();
        for l in rows.iter().filter_map(|r| r.limit.as_deref()) {
            if !l.is_empty() {
                *limits.entry(l).or_default() += 1;
            }
        }
        let limit = limits
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(l, _)| (*l).to_string());
        Sample {
            start: rows.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min),
            end: rows
                .iter()
                .map(|r| r.end_s)
                .fold(f64::NEG_INFINITY, f64::max),
            bps: rows.iter().map(|r| finite_or_zero(r.bits_per_second)).sum(),
            bytes: rows.iter().map(|r| r.bytes).fold(0u64, u64::saturating_add),
            retransmits: rows
                .iter()
                .filter_map(|r| r.retransmits)
                .reduce(u64::saturating_add),
            rtt_us: (!rtts.is_empty())
                .then(|| (rtts.iter().sum::<u64>() / rtts.len() as u64) as u32),
            streams: Some(rows.len() as u32),
            limit,
            omitted: rows.iter().any(|r| r.omitted),
        }
    }
}

/// One direction of the run.
struct Direction {
    name: String,
    totals: Vec<Sample>,
    streams: BTreeMap<i32, Vec<Sample>>,
}

/// The scale of the throughput axis.
#[derive(Debug, Clone, Copy)]
struct Unit {
    per: f64,
    name: &'static str,
}

impl Unit {
    fn for_max(bps: f64) -> Unit {
        if bps >= 1e9 {
            Unit {
                per: 1e9,
                name: "Gbit/s",
            }
        } else if bps >= 1e6 {
            Unit {
                per: 1e6,
                name: "Mbit/s",
            }
        } else {
            Unit {
                per: 1e3,
                name: "kbit/s",
            }
        }
    }
}

/// Everything the figure shows, gathered from the rows.
struct Model {
    title: String,
    dirs: Vec<Direction>,
    x: (f64, f64),
    unit: Unit,
    bps_max: f64,
    omitted: Vec<(f64, f64)>,
    /// Limit names in the order they first appear.
    limits: Vec<String>,
    unknown_limit: bool,
    retransmits: bool,
    rtt: bool,
    active: bool,
}

/// Directions in a fixed order: up, down, send, then the rest by name.
fn direction_rank(name: &str) -> (u8, &str) {
    match name {
        "up" => (0, name),
        "down" => (1, name),
        "send" => (2, name),
        _ => (3, name),
    }
}

impl Model {
    fn of(detail: &RunDetail) -> Result<Model, PlotError> {
        let rows: Vec<&IntervalRow> = detail.intervals.iter().filter(|r| usable(r)).collect();
        if rows.is_empty() {
            return Err(PlotError::NoIntervals(detail.run.id));
        }
        let dirs = directions(&rows);
        let x0 = rows.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
        let mut x1 = rows
            .iter()
            .map(|r| r.end_s)
            .fold(f64::NEG_INFINITY, f64::max);
        if x1 - x0 < 1e-6 {
            x1 = x0 + 1.0;
        }
        let totals = || dirs.iter().flat_map(|d| d.totals.iter());
        let samples = || {
            dirs.iter()
                .flat_map(|d| d.totals.iter().chain(d.streams.values().flatten()))
        };
        let bps_max = samples().map(|s| s.bps).fold(0.0, f64::max);
        let unit = Unit::for_max(bps_max);

        let mut omitted: Vec<(f64, f64)> = samples()
            .filter(|s| s.omitted)
            .map(|s| (s.start, s.end))
            .collect();
        omitted.sort_by(|a, b| a.0.total_cmp(&b.0));
        omitted.dedup();

        let mut limits: Vec<String> = Vec::new();
        let mut unknown_limit = false;
        for s in totals() {
            match &s.limit {
                Some(l) if !limits.contains(l) => limits.push(l.clone()),
                Some(_) => {}
                None => unknown_limit = true,
            }
        }
        let has_lines = dirs.iter().any(|d| !d.streams.is_empty());
        let active_values: BTreeSet<u32> = totals().filter_map(|s| s.streams).collect();
        // Worth a panel where streams come and go, or where no stream lines say how many.
        let active = !active_values.is_empty()
            && (active_values.len() > 1 || !has_lines)
            && dirs
                .iter()
                .all(|d| d.totals.iter().all(|s| s.streams.is_some()) || !has_lines);

        let title = title_of(detail, &dirs);
        Ok(Model {
            title,
            x: (x0, x1),
            unit,
            bps_max,
            omitted,
            limits,
            unknown_limit,
            retransmits: totals().any(|s| s.retransmits.is_some()),
            rtt: totals().any(|s| s.rtt_us.is_some()),
            active,
            dirs,
        })
    }
}

/// Each direction's totals and streams, a sample per interval: a total
/// row missing what its streams say takes it from them.
fn directions(rows: &[&IntervalRow]) -> Vec<Direction> {
    // direction -> idx -> (total row, stream rows)
    type Slot<'a> = (Option<&'a IntervalRow>, Vec<&'a IntervalRow>);
    let mut by_dir: BTreeMap<(u8, &str), BTreeMap<u32, Slot>> = BTreeMap::new();
    for r in rows {
        let slot = by_dir
            .entry(direction_rank(&r.direction))
            .or_default()
            .entry(r.idx)
            .or_default();
        if r.stream < 0 {
            slot.0 = Some(r);
        } else {
            slot.1.push(r);
        }
    }
    let mut dirs = Vec::new();
    for ((_, name), per_idx) in by_dir {
        let mut totals = Vec::new();
        let mut streams: BTreeMap<i32, Vec<Sample>> = BTreeMap::new();
        for (_, (total, stream_rows)) in per_idx {
            let total = match total {
                Some(t) => {
                    let mut total = Sample::of(t);
                    // What the total row lacks, its streams may say.
                    if !stream_rows.is_empty() {
                        let sum = Sample::sum(&stream_rows);
                        total.retransmits = total.retransmits.or(sum.retransmits);
                        total.rtt_us = total.rtt_us.or(sum.rtt_us);
                        total.limit = total.limit.or(sum.limit);
                    }
                    total
                }
                None => Sample::sum(&stream_rows),
            };
            totals.push(total);
            for s in stream_rows {
                streams.entry(s.stream).or_default().push(Sample::of(s));
            }
        }
        dirs.push(Direction {
            name: name.to_string(),
            totals,
            streams,
        });
    }
    dirs
}

/// The figure's title: the run, its hosts the way the data went, when,
/// its mean rate and, when not ok, its status.
fn title_of(detail: &RunDetail, dirs: &[Direction]) -> String {
    let run = &detail.run;
    let names: Vec<&str> = dirs.iter().map(|d| d.name.as_str()).collect();
    let hosts = match run.remote_host.as_deref().filter(|h| !h.is_empty()) {
        Some(remote) => data_way(&run.local_host, remote, &names, detail),
        None => run.local_host.clone(),
    };
    let multi = dirs.len() > 1;
    let mean = match run.bits_per_second.filter(|b| b.is_finite() && *b >= 0.0) {
        Some(b) => format!("mean {}", format_rate(b)),
        None => {
            let means: Vec<String> = dirs
                .iter()
                .filter_map(|d| {
                    let counted = d.totals.iter().filter(|s| !s.omitted);
                    let secs: f64 = counted.clone().map(|s| s.end - s.start).sum();
                    let bytes: f64 = counted.map(|s| s.bytes as f64).sum();
                    (secs > 0.0).then(|| {
                        let r = format_rate(bytes * 8.0 / secs);
                        if multi {
                            format!("{} {r}", d.name)
                        } else {
                            r
                        }
                    })
                })
                .collect();
            if means.is_empty() {
                "mean unknown".into()
            } else {
                format!("mean {}", means.join(", "))
            }
        }
    };
    let mut title = format!(
        "run {} \u{b7} {} \u{b7} {hosts} \u{b7} {} \u{b7} {mean}",
        run.id,
        run.kind,
        utc(run.started_at)
    );
    if run.status != "ok" && !run.status.is_empty() {
        title.push_str(&format!(" \u{b7} {}", run.status));
    }
    title
}

/// The hosts in the order the data went, and which way that is: perf's
/// `up` is the client (this host) sending, `down` (`-R`) the server; a cp
/// or sync's `send` rows are its source's, which is the server on a pull.
fn data_way(local: &str, remote: &str, dirs: &[&str], detail: &RunDetail) -> String {
    // A third-party test: `FROM -> TO`, this host carried none of it.
    if remote.contains(" -> ") {
        return remote.to_string();
    }
    let pull = detail
        .params
        .as_ref()
        .and_then(|p| p.get("direction"))
        .and_then(serde_json::Value::as_str)
        == Some("pull");
    let up = dirs.iter().any(|d| *d == "up" || (*d == "send" && !pull));
    let down = dirs.iter().any(|d| *d == "down" || (*d == "send" && pull));
    match (up, down) {
        (true, true) => format!("{local} \u{21c4} {remote} (both ways)"),
        (false, true) => format!("{remote} \u{2192} {local} (server to client)"),
        (true, false) => format!("{local} \u{2192} {remote} (client to server)"),
        (false, false) => format!("{local} \u{2014} {remote}"),
    }
}

/// `2026-11-23 21:27 UTC` from Unix seconds.
fn utc(ts: f64) -> String {
    longhaul_archive::when::utc(ts)
        .and_then(|s| s.get(..16).map(|m| format!("{m} UTC")))
        .unwrap_or_else(|| "date unknown".into())
}

// Colours. Directions' totals are dark and saturated; streams are lighter.
const DIRECTION_COLOURS: [RGBColor; 4] = [
    RGBColor(31, 78, 160),
    RGBColor(196, 58, 36),
    RGBColor(35, 120, 60),
    RGBColor(110, 60, 150),
];
const STREAM_COLOURS: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(89, 161, 79),
    RGBColor(225, 87, 89),
    RGBColor(118, 183, 178),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];
/// RTT lines: dark, apart from the bars and the totals.
const RTT_COLOURS: [RGBColor; 2] = [RGBColor(25, 25, 25), RGBColor(130, 130, 130)];
const OMITTED: RGBColor = RGBColor(120, 120, 120);
const NO_LIMIT: RGBColor = RGBColor(238, 238, 238);
/// Limits longhaul names (perf's and cp's), in fixed colours so that
/// figures compare.
const KNOWN_LIMITS: [(&str, RGBColor); 18] = [
    ("cwnd", RGBColor(230, 159, 0)),
    ("congestion", RGBColor(213, 94, 0)),
    ("path_loss", RGBColor(160, 40, 40)),
    ("receiver_window", RGBColor(0, 114, 178)),
    ("window", RGBColor(0, 114, 178)),
    ("send_buffer", RGBColor(86, 180, 233)),
    ("receiver_buffer", RGBColor(40, 60, 120)),
    ("storage_read", RGBColor(0, 158, 115)),
    ("storage_write", RGBColor(120, 200, 110)),
    ("sender_cpu", RGBColor(204, 121, 167)),
    ("application", RGBColor(245, 190, 215)),
    ("receiver_cpu", RGBColor(148, 103, 189)),
    ("files_in_flight", RGBColor(240, 228, 66)),
    ("rate_cap", RGBColor(95, 158, 160)),
    ("idle", RGBColor(170, 170, 170)),
    ("none", RGBColor(200, 200, 200)),
    ("network", RGBColor(140, 86, 75)),
    ("path", RGBColor(140, 86, 75)),
];
/// For limits not in [`KNOWN_LIMITS`], by order of appearance.
const OTHER_LIMITS: [RGBColor; 6] = [
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(127, 60, 141),
    RGBColor(17, 165, 121),
    RGBColor(57, 105, 172),
    RGBColor(242, 183, 1),
];

fn direction_colour(k: usize) -> RGBColor {
    DIRECTION_COLOURS[k % DIRECTION_COLOURS.len()]
}

/// Stream `j` of direction `k`: with several directions, their streams in
/// the direction's colour, lighter; else each its own.
fn stream_colour(multi: bool, k: usize, j: usize) -> RGBAColor {
    if multi {
        direction_colour(k).mix(0.45)
    } else {
        STREAM_COLOURS[j % STREAM_COLOURS.len()].mix(0.9)
    }
}

fn rtt_colour(k: usize) -> RGBColor {
    RTT_COLOURS[k % RTT_COLOURS.len()]
}

fn limit_colours(limits: &[String]) -> BTreeMap<&str, RGBColor> {
    let mut out = BTreeMap::new();
    let mut other = 0;
    for l in limits {
        let c = match KNOWN_LIMITS.iter().find(|(n, _)| n == l) {
            Some((_, c)) => *c,
            None => {
                other += 1;
                OTHER_LIMITS[(other - 1) % OTHER_LIMITS.len()]
            }
        };
        out.insert(l.as_str(), c);
    }
    out
}

/// A legend entry's sample.
enum Swatch {
    Line(ShapeStyle),
    Box(RGBAColor),
}

/// A line of the legend: its heading, and its entries.
type LegendRow<'a> = (Option<&'a str>, Vec<(Swatch, String)>);

/// Draws the legend entries left to right, wrapping; returns the height used.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rows: &[LegendRow],
    measure_only: bool,
) -> Result<u32, PlotError> {
    let font: TextStyle = (FAMILY, 14).into_font().into();
    let label = (FAMILY, 14).into_font().color(&RGBColor(60, 60, 60));
    let line_h = 22i32;
    let (w, _) = area.dim_in_pixel();
    let max_x = w as i32 - MARGIN as i32;
    let mut y = 4i32;
    for (heading, items) in rows {
        let mut x = MARGIN as i32;
        if let Some(h) = heading {
            if !measure_only {
                area.draw(&Text::new(h.to_string(), (x, y + 3), label.clone()))
                    .map_err(draw_error)?;
            }
            let (tw, _) = area.estimate_text_size(h, &label).map_err(draw_error)?;
            x += tw as i32 + 10;
        }
        for (swatch, text) in items {
            let (tw, _) = area.estimate_text_size(text, &font).map_err(draw_error)?;
            let width = 28 + tw as i32 + 18;
            if x + width > max_x && x > MARGIN as i32 + 80 {
                x = MARGIN as i32 + 20;
                y += line_h;
            }
            if !measure_only {
                let cy = y + line_h / 2 - 2;
                match swatch {
                    Swatch::Line(style) => area
                        .draw(&PathElement::new(vec![(x, cy), (x + 22, cy)], *style))
                        .map_err(draw_error)?,
                    Swatch::Box(c) => area
                        .draw(&Rectangle::new(
                            [(x + 2, cy - 7), (x + 20, cy + 7)],
                            c.filled(),
                        ))
                        .map_err(draw_error)?,
                }
                area.draw(&Text::new(text.clone(), (x + 28, y + 3), font.clone()))
                    .map_err(draw_error)?;
            }
            x += width;
        }
        y += line_h;
    }
    Ok(y as u32 + 4)
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, m: &Model) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(draw_error)?;
    let body = root
        .titled(&m.title, (FAMILY, 22).into_font())
        .map_err(draw_error)?;

    let colours = limit_colours(&m.limits);
    let legend_rows = legend_rows(m, &colours);
    let legend_h = legend(&body, &legend_rows, true)?;
    let (legend_area, rest) = body.split_vertically(legend_h);
    legend(&legend_area, &legend_rows, false)?;

    // The limit strip.
    let strip_h = 10 + 24 * m.dirs.len() as u32;
    let (strip_area, rest) = rest.split_vertically(strip_h);
    draw_limits(&strip_area, m, &colours)?;

    draw_panels(rest, m)
}

/// The legend's rows: the series drawn, then the limits' colours.
fn legend_rows(m: &Model, colours: &BTreeMap<&str, RGBColor>) -> Vec<LegendRow<'static>> {
    let multi = m.dirs.len() > 1;
    let prefix = |d: &Direction| {
        if multi {
            format!("{} ", d.name)
        } else {
            String::new()
        }
    };
    let mut series: Vec<(Swatch, String)> = Vec::new();
    for (k, d) in m.dirs.iter().enumerate() {
        let c = direction_colour(k);
        series.push((
            Swatch::Line(c.stroke_width(4)),
            format!("{}total", prefix(d)),
        ));
        let n = d.streams.len();
        if !multi && (1..=STREAM_COLOURS.len()).contains(&n) {
            // Each stream in its own colour, named by its number.
            for (j, id) in d.streams.keys().enumerate() {
                series.push((
                    Swatch::Line(stream_colour(multi, k, j).stroke_width(2)),
                    format!("stream {id}"),
                ));
            }
        } else if n > 0 {
            series.push((
                Swatch::Line(stream_colour(multi, k, 0).stroke_width(1)),
                format!(
                    "{}stream{} ({n}, numbered #0.. at their ends)",
                    prefix(d),
                    if n == 1 { "" } else { "s" }
                ),
            ));
        }
    }
    for (k, d) in m.dirs.iter().enumerate() {
        let c = direction_colour(k);
        if m.retransmits {
            series.push((
                Swatch::Box(c.mix(0.45)),
                format!("{}retransmits", prefix(d)),
            ));
        }
        if m.rtt {
            series.push((
                Swatch::Line(rtt_colour(k).stroke_width(2)),
                format!("{}RTT", prefix(d)),
            ));
        }
    }
    if m.active {
        for (k, d) in m.dirs.iter().enumerate() {
            series.push((
                Swatch::Line(direction_colour(k).stroke_width(2)),
                format!("{}active streams", prefix(d)),
            ));
        }
    }
    if !m.omitted.is_empty() {
        series.push((Swatch::Box(OMITTED.mix(0.25)), "omitted (--omit)".into()));
    }
    let mut limit_items: Vec<(Swatch, String)> = m
        .limits
        .iter()
        .map(|l| (Swatch::Box(colours[l.as_str()].mix(1.0)), l.clone()))
        .collect();
    if m.unknown_limit {
        limit_items.push((Swatch::Box(NO_LIMIT.mix(1.0)), "not recorded".into()));
    }
    vec![(None, series), (Some("limit:"), limit_items)]
}

/// The panels, sharing what height is left: throughput, then retransmits
/// and RTT, then active streams, each where there is something to draw.
fn draw_panels<DB: DrawingBackend>(
    rest: DrawingArea<DB, Shift>,
    m: &Model,
) -> Result<(), PlotError> {
    let mut weights = vec![5u32];
    if m.retransmits || m.rtt {
        weights.push(3);
    }
    if m.active {
        weights.push(2);
    }
    let (_, h) = rest.dim_in_pixel();
    let total: u32 = weights.iter().sum();
    let mut breaks = Vec::new();
    let mut acc = 0;
    for w in &weights[..weights.len() - 1] {
        acc += h * w / total;
        breaks.push(acc);
    }
    let areas = rest.split_by_breakpoints::<u32, u32, _, _>([], breaks);
    let last = areas.len() - 1;
    let mut areas = areas.into_iter().enumerate();
    if let Some((k, a)) = areas.next() {
        draw_throughput(&a, m, k == last)?;
    }
    if m.retransmits || m.rtt {
        if let Some((k, a)) = areas.next() {
            draw_retransmits_rtt(&a, m, k == last)?;
        }
    }
    if m.active {
        if let Some((k, a)) = areas.next() {
            draw_active(&a, m, k == last)?;
        }
    }
    Ok(())
}

/// A time panel's grid and axes: its y axis described and labelled, the
/// time axis labelled, and described on the bottom panel only.
fn draw_time_mesh<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    m: &Model,
    y_desc: &str,
    y_fmt: &dyn Fn(&f64) -> String,
    bottom: bool,
) -> Result<(), PlotError> {
    let x_fmt = time_label(m);
    let mut mesh = chart.configure_mesh();
    mesh.y_desc(y_desc)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(y_fmt)
        .label_style(label_style())
        .axis_desc_style(desc_style())
        .light_line_style(RGBColor(240, 240, 240));
    if bottom {
        mesh.x_desc("time (s)");
    }
    mesh.draw().map_err(draw_error)
}

fn label_style() -> TextStyle<'static> {
    (FAMILY, 13).into_font().into()
}

fn desc_style() -> TextStyle<'static> {
    (FAMILY, 14).into_font().into()
}

/// Time labels: whole seconds unless the run is short.
fn time_label(m: &Model) -> impl Fn(&f64) -> String {
    let span = m.x.1 - m.x.0;
    move |v: &f64| {
        if span < 5.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        }
    }
}

/// Value labels with as many decimals as the axis' span needs.
fn value_label(max: f64) -> impl Fn(&f64) -> String {
    move |v: &f64| {
        if max >= 20.0 {
            format!("{v:.0}")
        } else if max >= 2.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    }
}

/// Labels of a count: whole numbers only.
fn whole(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// Grey bands over the omitted intervals.
fn omitted_bands(m: &Model, y: (f64, f64)) -> impl Iterator<Item = Rectangle<(f64, f64)>> + '_ {
    m.omitted
        .iter()
        .map(move |&(s, e)| Rectangle::new([(s, y.0), (e, y.1)], OMITTED.mix(0.18).filled()))
}

/// Consecutive intervals under the same limit as one span: where the
/// limit changed is where a span ends (a gap in the intervals ends one too).
fn spans(totals: &[Sample]) -> Vec<(f64, f64, Option<&str>)> {
    let mut out: Vec<(f64, f64, Option<&str>)> = Vec::new();
    for s in totals {
        let limit = s.limit.as_deref();
        match out.last_mut() {
            Some(last) if last.2 == limit && s.start <= last.1 + 1e-6 && s.start >= last.0 => {
                last.1 = last.1.max(s.end);
            }
            _ => out.push((s.start, s.end, limit)),
        }
    }
    out
}

fn draw_limits<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Model,
    colours: &BTreeMap<&str, RGBColor>,
) -> Result<(), PlotError> {
    let n = m.dirs.len() as i32;
    let mut chart = ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(4)
        .margin_bottom(6)
        .x_label_area_size(0)
        .y_label_area_size(LEFT)
        .right_y_label_area_size(RIGHT)
        .build_cartesian_2d(m.x.0..m.x.1, (0..n).into_segmented())
        .map_err(draw_error)?
        .set_secondary_coord(m.x.0..m.x.1, 0.0..1.0);
    let names: Vec<String> = m
        .dirs
        .iter()
        .map(|d| {
            if n > 1 {
                format!("limit {}", d.name)
            } else {
                "limit".into()
            }
        })
        .collect();
    let formatter = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(k) | SegmentValue::Exact(k) => {
            // Rows from the top: the first direction first.
            let row = n - 1 - *k;
            names.get(row as usize).cloned().unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(n as usize)
        .y_label_formatter(&formatter)
        .label_style(label_style())
        .draw()
        .map_err(draw_error)?;
    let gap = if n > 1 { 2 } else { 0 };
    for (k, d) in m.dirs.iter().enumerate() {
        let row = n - 1 - k as i32;
        chart
            .draw_series(spans(&d.totals).into_iter().map(|(start, end, limit)| {
                let c = limit
                    .and_then(|l| colours.get(l))
                    .copied()
                    .unwrap_or(NO_LIMIT);
                let mut r = Rectangle::new(
                    [
                        (start, SegmentValue::Exact(row)),
                        (end, SegmentValue::Exact(row + 1)),
                    ],
                    c.filled(),
                );
                // Rows of directions apart.
                r.set_margin(gap, gap, 0, 0);
                r
            }))
            .map_err(draw_error)?;
    }
    chart
        .draw_series(m.omitted.iter().map(|&(s, e)| {
            Rectangle::new(
                [(s, SegmentValue::Exact(0)), (e, SegmentValue::Exact(n))],
                OMITTED.mix(0.18).filled(),
            )
        }))
        .map_err(draw_error)?;
    Ok(())
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Model,
    bottom: bool,
) -> Result<(), PlotError> {
    let y_max = (m.bps_max / m.unit.per * 1.08).max(1e-3);
    let mut chart = ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(6)
        .margin_bottom(4)
        .x_label_area_size(if bottom { 48 } else { 26 })
        .y_label_area_size(LEFT)
        .right_y_label_area_size(RIGHT)
        .build_cartesian_2d(m.x.0..m.x.1, 0.0..y_max)
        .map_err(draw_error)?
        .set_secondary_coord(m.x.0..m.x.1, 0.0..1.0);
    let y_desc = format!("throughput ({})", m.unit.name);
    draw_time_mesh(&mut chart, m, &y_desc, &value_label(y_max), bottom)?;
    chart
        .draw_series(omitted_bands(m, (0.0, y_max)))
        .map_err(draw_error)?;
    let multi = m.dirs.len() > 1;
    let per = m.unit.per;
    for (k, d) in m.dirs.iter().enumerate() {
        for (j, (id, samples)) in d.streams.iter().enumerate() {
            let c = stream_colour(multi, k, j);
            chart
                .draw_series(LineSeries::new(
                    samples.iter().map(|s| (s.mid(), s.bps / per)),
                    c.stroke_width(1),
                ))
                .map_err(draw_error)?;
            // Each line numbered where it ends (the legend's names, when
            // it can list them, say the same).
            if let Some(last) = samples.last() {
                let name = if multi {
                    format!("{} #{id}", d.name)
                } else {
                    format!("#{id}")
                };
                let style = (FAMILY, 12).into_font().color(&c);
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((last.mid(), last.bps / per))
                            + Text::new(name, (4, -6), style),
                    ))
                    .map_err(draw_error)?;
            }
        }
    }
    for (k, d) in m.dirs.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(
                d.totals.iter().map(|s| (s.mid(), s.bps / per)),
                direction_colour(k).stroke_width(3),
            ))
            .map_err(draw_error)?;
    }
    Ok(())
}

fn draw_retransmits_rtt<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Model,
    bottom: bool,
) -> Result<(), PlotError> {
    let totals = || m.dirs.iter().flat_map(|d| d.totals.iter());
    let re_max = totals().filter_map(|s| s.retransmits).max().unwrap_or(0) as f64;
    let re_top = (re_max * 1.1).max(1.0);
    let rtt_max = totals()
        .filter_map(|s| s.rtt_us)
        .max()
        .map_or(0.0, |v| f64::from(v) / 1000.0);
    let rtt_top = (rtt_max * 1.1).max(0.1);
    // The left axis is the retransmits when the run has them, else the RTT.
    let (left_top, left_desc) = if m.retransmits {
        (re_top, "retransmits per interval")
    } else {
        (rtt_top, "RTT (ms)")
    };
    let mut chart = ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(6)
        .margin_bottom(4)
        .x_label_area_size(if bottom { 48 } else { 26 })
        .y_label_area_size(LEFT)
        .right_y_label_area_size(RIGHT)
        .build_cartesian_2d(m.x.0..m.x.1, 0.0..left_top)
        .map_err(draw_error)?
        .set_secondary_coord(m.x.0..m.x.1, 0.0..rtt_top);
    let y_fmt: &dyn Fn(&f64) -> String = if m.retransmits {
        &whole
    } else {
        &value_label(left_top)
    };
    let y2_fmt = value_label(rtt_top);
    draw_time_mesh(&mut chart, m, left_desc, y_fmt, bottom)?;
    if m.retransmits && m.rtt {
        chart
            .configure_secondary_axes()
            .y_desc("RTT (ms)")
            .y_label_formatter(&y2_fmt)
            .label_style(label_style())
            .axis_desc_style(desc_style())
            .draw()
            .map_err(draw_error)?;
    }
    chart
        .draw_series(omitted_bands(m, (0.0, left_top)))
        .map_err(draw_error)?;
    let n = m.dirs.len() as f64;
    let intervals = m.dirs.iter().map(|d| d.totals.len()).max().unwrap_or(0);
    if m.retransmits && intervals > MAX_BARS {
        // Bars thinner than a pixel or two: a line says more.
        for (k, d) in m.dirs.iter().enumerate() {
            let points = d
                .totals
                .iter()
                .filter_map(|s| Some((s.mid(), s.retransmits? as f64)));
            chart
                .draw_series(LineSeries::new(
                    points,
                    direction_colour(k).mix(0.6).stroke_width(1),
                ))
                .map_err(draw_error)?;
        }
    } else if m.retransmits {
        for (k, d) in m.dirs.iter().enumerate() {
            let c = direction_colour(k).mix(0.45);
            chart
                .draw_series(d.totals.iter().filter_map(|s| {
                    let r = s.retransmits?;
                    let w = (s.end - s.start) / n;
                    let x0 = s.start + w * k as f64 + w * 0.1;
                    let x1 = s.start + w * (k as f64 + 1.0) - w * 0.1;
                    Some(Rectangle::new([(x0, 0.0), (x1, r as f64)], c.filled()))
                }))
                .map_err(draw_error)?;
        }
    }
    if m.rtt {
        for (k, d) in m.dirs.iter().enumerate() {
            let points = d
                .totals
                .iter()
                .filter_map(|s| Some((s.mid(), f64::from(s.rtt_us?) / 1000.0)));
            let style = rtt_colour(k).stroke_width(2);
            if m.retransmits {
                chart
                    .draw_secondary_series(LineSeries::new(points, style))
                    .map_err(draw_error)?;
            } else {
                chart
                    .draw_series(LineSeries::new(points, style))
                    .map_err(draw_error)?;
            }
        }
    }
    Ok(())
}

fn draw_active<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Model,
    bottom: bool,
) -> Result<(), PlotError> {
    let max = m
        .dirs
        .iter()
        .flat_map(|d| d.totals.iter())
        .filter_map(|s| s.streams)
        .max()
        .unwrap_or(1);
    let top = f64::from(max) * 1.15 + 0.5;
    let mut chart = ChartBuilder::on(area)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_top(6)
        .margin_bottom(4)
        .x_label_area_size(if bottom { 48 } else { 26 })
        .y_label_area_size(LEFT)
        .right_y_label_area_size(RIGHT)
        .build_cartesian_2d(m.x.0..m.x.1, 0.0..top)
        .map_err(draw_error)?
        .set_secondary_coord(m.x.0..m.x.1, 0.0..1.0);
    draw_time_mesh(&mut chart, m, "active streams", &whole, bottom)?;
    chart
        .draw_series(omitted_bands(m, (0.0, top)))
        .map_err(draw_error)?;
    for (k, d) in m.dirs.iter().enumerate() {
        // Steps: the count holds for the whole interval.
        let points: Vec<(f64, f64)> = d
            .totals
            .iter()
            .filter_map(|s| {
                let v = f64::from(s.streams?);
                Some([(s.start, v), (s.end, v)])
            })
            .flatten()
            .collect();
        chart
            .draw_series(LineSeries::new(points, direction_colour(k).stroke_width(2)))
            .map_err(draw_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_archive::model::RunRow;

    fn run_row(id: i64, kind: &str) -> RunRow {
        RunRow {
            id,
            kind: kind.into(),
            status: "ok".into(),
            started_at: 1_795_000_000.0,
            ended_at: Some(1_795_000_031.0),
            updated_at: 1_795_000_031.0,
            command: format!("longhaul {kind}"),
            local_host: "alpha".into(),
            remote_host: Some("beta.example".into()),
            export: None,
            grant: None,
            source: None,
            dest: None,
            bytes: None,
            files: None,
            seconds: Some(30.0),
            bits_per_second: None,
            verified: None,
            verdict: None,
            live_bytes: 0,
            live_files: 0,
            live_bps: None,
            error: None,
            exit_code: Some(0),
            lost: 0,
            dry_run: false,
        }
    }

    fn detail(run: RunRow, intervals: Vec<IntervalRow>) -> RunDetail {
        RunDetail {
            run,
            params: None,
            summary: None,
            warnings: vec![],
            intervals,
            file_count: 0,
        }
    }

    fn row(idx: u32, direction: &str, stream: i32, bps: f64) -> IntervalRow {
        IntervalRow {
            idx,
            direction: direction.into(),
            stream,
            start_s: f64::from(idx),
            end_s: f64::from(idx + 1),
            bytes: (bps / 8.0) as u64,
            bits_per_second: bps,
            retransmits: None,
            rtt_us: None,
            cwnd_bytes: None,
            streams: None,
            limit: None,
            omitted: false,
        }
    }

    /// A perf run: 4 streams × 30 intervals up with their totals, the
    /// limit going from cwnd to receiver_window to send_buffer, the first
    /// two intervals omitted.
    fn perf() -> RunDetail {
        let mut rows = Vec::new();
        for idx in 0..30u32 {
            let limit = match idx {
                0..=9 => "cwnd",
                10..=19 => "receiver_window",
                _ => "send_buffer",
            };
            let mut total = 0.0;
            let mut re = 0;
            for s in 0..4 {
                let ramp = f64::from(idx.min(5) + 1) / 6.0;
                let bps = 2.3e9 * ramp + f64::from(s) * 5e7 + f64::from(idx % 3) * 4e7;
                total += bps;
                let r = u64::from((idx * 7 + s as u32 * 3) % 11);
                re += r;
                rows.push(IntervalRow {
                    retransmits: Some(r),
                    rtt_us: Some(40_000 + idx * 150),
                    cwnd_bytes: Some(8 << 20),
                    limit: Some(limit.into()),
                    omitted: idx < 2,
                    ..row(idx, "up", s, bps)
                });
            }
            rows.push(IntervalRow {
                retransmits: Some(re),
                rtt_us: Some(40_000 + idx * 150),
                limit: Some(limit.into()),
                omitted: idx < 2,
                streams: Some(4),
                ..row(idx, "up", -1, total)
            });
        }
        let mut run = run_row(42, "perf");
        run.bits_per_second = Some(9.41e9);
        detail(run, rows)
    }

    /// A cp run: totals only, the active streams growing, limits changing.
    fn cp() -> RunDetail {
        let rows = (0..20u32)
            .map(|idx| IntervalRow {
                retransmits: Some(u64::from(idx % 4)),
                rtt_us: Some(12_000),
                streams: Some((idx / 3 + 1).min(6)),
                limit: Some(
                    if idx < 8 {
                        "storage_read"
                    } else {
                        "congestion"
                    }
                    .into(),
                ),
                ..row(idx, "send", -1, 4e8 + f64::from(idx) * 2e7)
            })
            .collect();
        let mut run = run_row(7, "cp");
        run.remote_host = None;
        detail(run, rows)
    }

    fn decode_png(path: &Path) -> (u32, u32, usize) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let px = info.color_type.samples();
        let colours: BTreeSet<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
        (info.width, info.height, colours.len())
    }

    #[test]
    fn a_perf_run_draws_to_svg_with_its_streams_totals_and_limits() {
        let d = perf();
        let svg = svg_string(&d).unwrap();
        assert!(svg.contains("<svg"), "{}", &svg[..200.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        // 4 stream lines + the total + the RTT line.
        let lines = svg.matches("<polyline").count() + svg.matches("<path").count();
        assert!(lines >= 6, "{lines} lines");
        for name in [
            "cwnd",
            "receiver_window",
            "send_buffer",
            "omitted",
            "retransmits",
        ] {
            assert!(svg.contains(name), "no {name} in the SVG");
        }
        assert!(svg.contains("run 42"));
        assert!(svg.contains("9.41 Gbit/s"));
        assert!(svg.contains("throughput (Gbit/s)"));
        assert!(svg.contains("RTT (ms)"));
        assert!(svg.contains("2026-11-18"), "the date");
        assert_eq!(
            counts(&d),
            Counts {
                intervals: 30,
                streams: 4
            }
        );
    }

    #[test]
    fn the_title_names_the_way_the_data_went() {
        // perf -R: the server sent.
        let mut d = perf();
        for r in &mut d.intervals {
            r.direction = "down".into();
        }
        let svg = svg_string(&d).unwrap();
        assert!(
            svg.contains("beta.example \u{2192} alpha (server to client)"),
            "{}",
            title_of(&svg)
        );
        assert!(!svg.contains("alpha \u{2192} beta.example"));
        // perf without -R: the client sent.
        let svg = svg_string(&perf()).unwrap();
        assert!(
            svg.contains("alpha \u{2192} beta.example (client to server)"),
            "{}",
            title_of(&svg)
        );
        // A cp pull: its rows are the source's, the server's.
        let mut d = cp();
        d.run.remote_host = Some("beta.example".into());
        d.params = Some(serde_json::json!({"direction": "pull"}));
        let svg = svg_string(&d).unwrap();
        assert!(
            svg.contains("beta.example \u{2192} alpha (server to client)"),
            "{}",
            title_of(&svg)
        );
    }

    fn title_of(svg: &str) -> &str {
        svg.split("run ")
            .nth(1)
            .map_or(svg, |t| &t[..t.len().min(160)])
    }

    #[test]
    fn several_streams_are_each_labelled() {
        let svg = svg_string(&perf()).unwrap();
        for s in 0..4 {
            assert!(
                svg.contains(&format!(">\nstream {s}\n<")),
                "no legend for stream {s}"
            );
            assert!(
                svg.contains(&format!(">\n#{s}\n<")),
                "stream {s}'s line is not numbered"
            );
        }
        // More streams than colours: numbered at their ends.
        let rows: Vec<IntervalRow> = (0..5u32)
            .flat_map(|idx| (0..16).map(move |s| row(idx, "up", s, 1e8 + f64::from(s) * 1e7)))
            .collect();
        let svg = svg_string(&detail(run_row(3, "perf"), rows)).unwrap();
        assert!(svg.contains("streams (16, numbered #0.. at their ends)"));
        for s in 0..16 {
            assert!(
                svg.contains(&format!(">\n#{s}\n<")),
                "stream {s}'s line is not numbered"
            );
        }
    }

    #[test]
    fn both_formats_are_written_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        for d in [perf(), cp()] {
            let svg = dir.path().join(format!("{}.svg", d.run.id));
            render(&d, &svg).unwrap();
            let text = std::fs::read_to_string(&svg).unwrap();
            assert!(text.starts_with("<svg"));
            assert!(text.contains("<polyline"));

            let png = dir.path().join(format!("{}.PNG", d.run.id));
            render(&d, &png).unwrap();
            let (w, h, colours) = decode_png(&png);
            assert_eq!((w, h), (WIDTH, HEIGHT));
            assert!(colours > 100, "only {colours} colours: blank?");
        }
    }

    #[test]
    fn a_cp_run_shows_totals_active_streams_and_its_limits() {
        let d = cp();
        let svg = svg_string(&d).unwrap();
        for name in [
            "storage_read",
            "congestion",
            "active streams",
            "Mbit/s",
            "alpha",
        ] {
            assert!(svg.contains(name), "no {name} in the SVG");
        }
        assert!(!svg.contains("omitted"));
        assert!(
            svg.contains("mean 590 Mbit/s"),
            "a mean computed from the intervals"
        );
        assert_eq!(
            counts(&d),
            Counts {
                intervals: 20,
                streams: 6
            }
        );
    }

    #[test]
    fn streams_without_total_rows_are_summed_and_directions_kept_apart() {
        let rows: Vec<IntervalRow> = (0..10u32)
            .flat_map(|idx| {
                (0..2).flat_map(move |s| {
                    [
                        IntervalRow {
                            limit: Some("mystery".into()),
                            ..row(idx, "up", s, 3e8)
                        },
                        row(idx, "down", s, 2e8),
                    ]
                })
            })
            .collect();
        let d = detail(run_row(3, "perf"), rows);
        let m = Model::of(&d).unwrap();
        assert_eq!(m.dirs.len(), 2);
        assert_eq!(m.dirs[0].name, "up");
        assert_eq!(m.dirs[1].name, "down");
        assert!((m.dirs[0].totals[3].bps - 6e8).abs() < 1.0);
        assert_eq!(m.dirs[0].totals[3].limit.as_deref(), Some("mystery"));
        assert!(m.unknown_limit, "down has no limits");
        let svg = svg_string(&d).unwrap();
        for name in [
            "limit up",
            "limit down",
            "mystery",
            "not recorded",
            "up total",
        ] {
            assert!(svg.contains(name), "no {name} in the SVG");
        }
        assert_eq!(counts(&d).streams, 4);
    }

    #[test]
    fn totals_borrow_what_they_lack_from_streams_and_long_runs_draw_lines() {
        let mut rows = Vec::new();
        for idx in 0..(MAX_BARS as u32 + 50) {
            for s in 0..2 {
                rows.push(IntervalRow {
                    retransmits: Some(3),
                    rtt_us: Some(10_000 + 2_000 * s as u32),
                    ..row(idx, "down", s, 5e8)
                });
            }
            rows.push(IntervalRow {
                limit: Some("receiver_cpu".into()),
                ..row(idx, "down", -1, 1e9)
            });
        }
        let d = detail(run_row(11, "perf"), rows);
        let m = Model::of(&d).unwrap();
        let t = &m.dirs[0].totals[7];
        assert_eq!((t.retransmits, t.rtt_us), (Some(6), Some(11_000)));
        let svg = svg_string(&d).unwrap();
        assert!(svg.contains("receiver_cpu") && svg.contains("RTT (ms)"));
        // Retransmits as a line: no bar per interval.
        assert!(svg.matches("<rect").count() < MAX_BARS, "bars drawn");
    }

    #[test]
    fn no_intervals_is_a_clear_error_and_writes_nothing() {
        let d = detail(run_row(5, "doctor"), vec![]);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("d.png");
        let e = render(&d, &out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "run 5 has no intervals to plot (a doctor or bench disk run keeps none); nor does a copy or test that ended within its first interval"
        );
        assert!(!out.exists());
        assert!(matches!(svg_string(&d), Err(PlotError::NoIntervals(5))));
    }

    #[test]
    fn other_extensions_are_refused_by_name() {
        let d = perf();
        let dir = tempfile::tempdir().unwrap();
        for name in ["plot.jpg", "plot"] {
            let out = dir.path().join(name);
            let e = render(&d, &out).unwrap_err().to_string();
            assert!(e.contains(".svg or .png"), "{e}");
            if name.ends_with("jpg") {
                assert!(e.contains(".jpg"), "{e}");
            }
            assert!(!out.exists());
        }
    }

    #[test]
    fn an_unwritable_place_is_told() {
        let d = cp();
        let dir = tempfile::tempdir().unwrap();
        for name in ["none/x.png", "none/x.svg"] {
            let e = render(&d, &dir.path().join(name)).unwrap_err();
            assert!(matches!(e, PlotError::Write { .. }), "{e}");
            assert!(e.to_string().contains("cannot write"), "{e}");
        }
    }

    #[test]
    fn odd_values_do_not_break_the_drawing() {
        let mut rows = vec![
            IntervalRow {
                bits_per_second: f64::NAN,
                ..row(0, "up", -1, 0.0)
            },
            IntervalRow {
                start_s: f64::INFINITY,
                ..row(1, "up", -1, 1e9)
            },
            IntervalRow {
                bits_per_second: -5.0,
                rtt_us: Some(0),
                retransmits: Some(0),
                ..row(2, "up", -1, 0.0)
            },
        ];
        // A single instant: start == end.
        rows.push(IntervalRow {
            start_s: 3.0,
            end_s: 3.0,
            ..row(3, "up", 0, 0.0)
        });
        let mut run = run_row(9, "perf");
        run.started_at = f64::NAN;
        run.bits_per_second = Some(f64::INFINITY);
        let d = detail(run, rows);
        let svg = svg_string(&d).unwrap();
        assert!(svg.contains("date unknown"));
        // Only unusable rows: as if none.
        let d = detail(
            run_row(10, "perf"),
            vec![IntervalRow {
                end_s: f64::NAN,
                ..row(0, "up", -1, 1e9)
            }],
        );
        assert!(matches!(svg_string(&d), Err(PlotError::NoIntervals(10))));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0.0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400.0), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_795_000_000.0), "2026-11-18 11:06 UTC");
        assert_eq!(utc(-1.0), "date unknown");
    }
}
