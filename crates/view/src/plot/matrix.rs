//! `longhaul plot` of a matrix run (issue 30): tools by paths, one panel
//! per workload, in Gbit/s.
//!
//! In each panel a group of bars per tool and settings; in a group a bar
//! per path and direction, the path by its colour, `put` solid and `get`
//! light with the path's colour as its edge. A whisker spans the runs'
//! slowest to fastest; a cell whose data did not verify is marked with a
//! red cross above its bar, a cell that failed with a red `x` on the axis.
//! The same-run limits of a file workload (its local copy, the
//! destination's write rate) are grey lines across the panel.
//!
//! Tool names and settings come from the user's `--tools-file`: plotters
//! escapes every text it writes into an SVG, so a name is text, never
//! markup (tested).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use longhaul_archive::matrix::{Cell, Document};
use longhaul_archive::model::RunRow;

use super::{draw_error, format_of, register_font, utc, Format, PlotError, FAMILY, MARGIN};

/// The figure's width; its height grows with the panels.
pub const WIDTH: u32 = 1400;
const HEAD: u32 = 110;
const PANEL: u32 = 340;

/// Paths' colours (put solid, get light).
const PATH_COLOURS: [RGBColor; 6] = [
    RGBColor(31, 78, 160),
    RGBColor(213, 94, 0),
    RGBColor(35, 120, 60),
    RGBColor(110, 60, 150),
    RGBColor(0, 140, 160),
    RGBColor(150, 110, 20),
];
const WHISKER: RGBColor = RGBColor(40, 40, 40);
const BAD: RGBColor = RGBColor(200, 30, 30);
const LIMIT: RGBColor = RGBColor(120, 120, 120);

fn path_colour(k: usize) -> RGBColor {
    PATH_COLOURS[k % PATH_COLOURS.len()]
}

/// The figure's height for `m`.
pub fn height(m: &Document) -> u32 {
    HEAD + PANEL * panels(m).len().max(1) as u32
}

/// The workloads that have cells, in the matrix's order.
fn panels(m: &Document) -> Vec<String> {
    m.workloads()
        .into_iter()
        .filter(|w| m.cells.iter().any(|c| &c.workload == w))
        .collect()
}

/// What the figure counts: cells drawn and panels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub cells: usize,
    pub panels: usize,
}

pub fn counts(m: &Document) -> Counts {
    Counts {
        cells: m.cells.len(),
        panels: panels(m).len(),
    }
}

/// Draws the matrix of `run` to `out`: SVG or PNG by its extension.
pub fn render(run: &RunRow, m: &Document, out: &std::path::Path) -> Result<(), PlotError> {
    let format = format_of(out)?;
    if m.cells.is_empty() {
        return Err(PlotError::NoCells(run.id));
    }
    let write_error = |e: std::io::Error| PlotError::Write {
        path: out.to_path_buf(),
        why: e.to_string(),
    };
    match format {
        Format::Svg => std::fs::write(out, svg_string(run, m)?).map_err(write_error),
        Format::Png => {
            register_font()?;
            std::fs::File::create(out).map_err(write_error)?;
            let root = BitMapBackend::new(out, (WIDTH, height(m))).into_drawing_area();
            draw(&root, run, m)?;
            root.present().map_err(|e| PlotError::Write {
                path: out.to_path_buf(),
                why: e.to_string(),
            })
        }
    }
}

/// The SVG of the matrix, as [`render`] writes it.
pub fn svg_string(run: &RunRow, m: &Document) -> Result<String, PlotError> {
    if m.cells.is_empty() {
        return Err(PlotError::NoCells(run.id));
    }
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height(m))).into_drawing_area();
        draw(&root, run, m)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

fn gbit(bytes_per_second: f64) -> f64 {
    if bytes_per_second.is_finite() && bytes_per_second > 0.0 {
        bytes_per_second * 8.0 / 1e9
    } else {
        0.0
    }
}

/// A name cut to `n` characters, for a label under its group.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let head: String = s.chars().take(n.saturating_sub(1)).collect();
        format!("{head}\u{2026}")
    }
}

fn workload_text(w: &str) -> String {
    match w {
        "mem" => "mem: memory to memory".into(),
        "elephant" => "elephant: one large file".into(),
        "smallfiles" => "smallfiles: many small files".into(),
        "tree" => "tree: a mixed tree".into(),
        _ => w.to_string(),
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    run: &RunRow,
    m: &Document,
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(draw_error)?;
    let mut title = format!(
        "matrix run {} \u{b7} {} \u{b7} {} \u{b7} median Gbit/s",
        run.id,
        run.local_host,
        utc(run.started_at)
    );
    if run.status != "ok" && !run.status.is_empty() {
        title.push_str(&format!(" \u{b7} {}", run.status));
    }
    let body = root
        .titled(&title, (FAMILY, 22).into_font())
        .map_err(draw_error)?;
    let (legend_area, rest) = body.split_vertically(HEAD - 40);
    draw_legend(&legend_area, m)?;
    let ws = panels(m);
    let areas = rest.split_evenly((ws.len().max(1), 1));
    for (w, area) in ws.iter().zip(areas.iter()) {
        draw_panel(area, m, w)?;
    }
    Ok(())
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Document,
) -> Result<(), PlotError> {
    let font: TextStyle = (FAMILY, 14).into_font().into();
    let (w, _) = area.dim_in_pixel();
    let mut x = MARGIN as i32;
    let mut y = 6i32;
    let mut item = |swatch: &dyn Fn(i32, i32) -> Result<(), PlotError>,
                    text: String|
     -> Result<(), PlotError> {
        let (tw, _) = area.estimate_text_size(&text, &font).map_err(draw_error)?;
        let width = 28 + tw as i32 + 18;
        if x + width > w as i32 - MARGIN as i32 {
            x = MARGIN as i32;
            y += 24;
        }
        swatch(x, y + 9)?;
        area.draw(&Text::new(text, (x + 26, y + 2), font.clone()))
            .map_err(draw_error)?;
        x += width;
        Ok(())
    };
    for (k, p) in m.path_names().iter().enumerate() {
        let c = path_colour(k);
        for (dir, light) in [("put", false), ("get", true)] {
            let swatch = |x: i32, cy: i32| {
                let r = [(x + 2, cy - 7), (x + 20, cy + 7)];
                if light {
                    area.draw(&Rectangle::new(r, c.mix(0.3).filled()))
                        .map_err(draw_error)?;
                    area.draw(&Rectangle::new(r, c.stroke_width(2)))
                        .map_err(draw_error)
                } else {
                    area.draw(&Rectangle::new(r, c.filled()))
                        .map_err(draw_error)
                }
            };
            item(&swatch, format!("{} {dir}", cut(p, 30)))?;
        }
    }
    item(
        &|x, cy| {
            area.draw(&PathElement::new(
                vec![(x + 11, cy - 8), (x + 11, cy + 8)],
                WHISKER.stroke_width(1),
            ))
            .map_err(draw_error)
        },
        "slowest to fastest run".into(),
    )?;
    item(
        &|x, cy| {
            area.draw(&Text::new(
                "\u{2717}",
                (x + 4, cy - 9),
                (FAMILY, 16).into_font().color(&BAD),
            ))
            .map_err(draw_error)
        },
        "data not verified".into(),
    )?;
    if m.cells.iter().any(|c| c.workload != "mem") {
        item(
            &|x, cy| {
                area.draw(&PathElement::new(
                    vec![(x, cy), (x + 22, cy)],
                    LIMIT.stroke_width(2),
                ))
                .map_err(draw_error)
            },
            "same-run limits".into(),
        )?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    m: &Document,
    w: &str,
) -> Result<(), PlotError> {
    let paths = m.path_names();
    let cells: Vec<&Cell> = m
        .cells
        .iter()
        .filter(|c| c.workload == w)
        .map(|c| &c.cell)
        .collect();
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for c in &cells {
        if !rows.contains(&(c.tool.as_str(), c.settings.as_str())) {
            rows.push((&c.tool, &c.settings));
        }
    }
    // Each group's slots: every path, put then get.
    let slots: Vec<(usize, &str)> = (0..paths.len())
        .flat_map(|k| [(k, "put"), (k, "get")])
        .filter(|(k, d)| {
            cells
                .iter()
                .any(|c| c.path == paths[*k] && c.direction == *d)
        })
        .collect();
    let limits = panel_limits(m, w);
    let top = cells
        .iter()
        .filter_map(|c| c.rate.as_ref())
        .map(|r| gbit(r.max_bytes_per_second).max(gbit(r.median_bytes_per_second)))
        .chain(limits.iter().map(|(_, v)| *v))
        .fold(0.0, f64::max);
    let y_max = (top * 1.12).max(1e-3);
    let n = rows.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(workload_text(w), (FAMILY, 17).into_font())
        .margin_left(MARGIN)
        .margin_right(MARGIN * 3)
        .margin_top(4)
        .margin_bottom(4)
        .x_label_area_size(34)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, 0.0..y_max)
        .map_err(draw_error)?;
    let y_fmt = |v: &f64| {
        if y_max >= 20.0 {
            format!("{v:.0}")
        } else if y_max >= 2.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc("Gbit/s")
        .y_label_formatter(&y_fmt)
        .label_style((FAMILY, 13).into_font())
        .axis_desc_style((FAMILY, 14).into_font())
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(draw_error)?;
    let group = 0.8;
    let slot_w = group / slots.len().max(1) as f64;
    let label: TextStyle = (FAMILY, 13).into_font().into();
    let (px_w, _) = area.dim_in_pixel();
    // Characters a group's label may take: its share of the width.
    let chars = ((f64::from(px_w) / n) / 8.0).max(6.0) as usize;
    for (i, (tool, settings)) in rows.iter().enumerate() {
        let x0 = i as f64 + (1.0 - group) / 2.0;
        let name = cut(&format!("{tool} ({settings})"), chars);
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((i as f64 + 0.5, 0.0))
                    + Text::new(
                        name,
                        (0, 8),
                        label.clone().pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Top,
                        )),
                    ),
            ))
            .map_err(draw_error)?;
        for (j, (k, dir)) in slots.iter().enumerate() {
            let Some(c) = cells.iter().find(|c| {
                c.tool == *tool
                    && c.settings == *settings
                    && c.path == paths[*k]
                    && c.direction == *dir
            }) else {
                continue;
            };
            draw_cell(&mut chart, c, (x0 + j as f64 * slot_w, slot_w), *k, dir)?;
        }
    }
    draw_limit_lines(&mut chart, &limits, n)?;
    Ok(())
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The same-run limits of workload `w`, Gbit/s: its local copy and, for
/// files, the destination's write.
fn panel_limits(m: &Document, w: &str) -> Vec<(String, f64)> {
    m.limits
        .local_copy_bytes_per_second
        .get(w)
        .map(|v| ("local copy".to_string(), gbit(*v)))
        .into_iter()
        .chain(
            m.limits
                .destination_write_bytes_per_second
                .filter(|_| w != "mem")
                .map(|v| ("destination write".to_string(), gbit(v))),
        )
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// One cell's bar, at `a` and `slot_w` wide, in path `k`'s colour: put
/// solid, get light; its whisker; a red cross when it did not verify, a
/// red `x` on the axis when it failed.
fn draw_cell<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    c: &Cell,
    (a, slot_w): (f64, f64),
    k: usize,
    dir: &str,
) -> Result<(), PlotError> {
    let b = a + slot_w * 0.9;
    let colour = path_colour(k);
    let Some(r) = &c.rate else {
        if c.error.is_some() {
            chart
                .draw_series(std::iter::once(Text::new(
                    "x",
                    ((a + b) / 2.0, 0.0),
                    (FAMILY, 14).into_font().color(&BAD),
                )))
                .map_err(draw_error)?;
        }
        return Ok(());
    };
    let v = gbit(r.median_bytes_per_second);
    if dir == "put" {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(a, 0.0), (b, v)],
                colour.filled(),
            )))
            .map_err(draw_error)?;
    } else {
        chart
            .draw_series([
                Rectangle::new([(a, 0.0), (b, v)], colour.mix(0.3).filled()),
                Rectangle::new([(a, 0.0), (b, v)], colour.stroke_width(2)),
            ])
            .map_err(draw_error)?;
    }
    let (lo, hi) = (gbit(r.min_bytes_per_second), gbit(r.max_bytes_per_second));
    let mid = (a + b) / 2.0;
    if hi > lo {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(mid, lo), (mid, hi)],
                WHISKER.stroke_width(1),
            )))
            .map_err(draw_error)?;
    }
    if c.verified == Some(false) {
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((mid, v.max(hi)))
                    + Text::new("\u{2717}", (-5, -20), (FAMILY, 16).into_font().color(&BAD)),
            ))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// The limits as grey lines across the panel, each named at its right end.
fn draw_limit_lines<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    limits: &[(String, f64)],
    n: f64,
) -> Result<(), PlotError> {
    for (name, v) in limits {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, *v), (n, *v)],
                LIMIT.stroke_width(2),
            )))
            .map_err(draw_error)?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((n, *v))
                    + Text::new(
                        format!("{name} {v:.2}"),
                        (-6, -16),
                        (FAMILY, 12).into_font().color(&LIMIT).pos(
                            plotters::style::text_anchor::Pos::new(
                                plotters::style::text_anchor::HPos::Right,
                                plotters::style::text_anchor::VPos::Top,
                            ),
                        ),
                    ),
            ))
            .map_err(draw_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn matrix(tool: &str) -> (RunRow, Document) {
        let cell = |path: &str, w: &str, d: &str, bps: f64, verified: Option<bool>| {
            json!({"tool": tool, "settings": "<b>best</b>", "path": path, "workload": w,
                   "direction": d, "verified": verified,
                   "rate": {"median_bytes_per_second": bps, "min_bytes_per_second": bps * 0.9,
                            "max_bytes_per_second": bps * 1.1, "median_bits_per_second": bps * 8.0}})
        };
        let doc = json!({
            "format": "longhaul-matrix", "format_version": 1,
            "params": {"workloads": ["mem", "elephant"]},
            "paths": [{"name": "loopback"}, {"name": "80ms"}],
            "cells": [
                cell("loopback", "mem", "put", 2e9, None),
                cell("80ms", "mem", "get", 1e8, None),
                cell("loopback", "elephant", "put", 5e8, Some(true)),
                cell("loopback", "elephant", "get", 4e8, Some(false)),
                {"tool": "cp", "settings": "defaults", "path": "loopback", "workload": "elephant",
                 "direction": "put", "error": "exit 1"}
            ],
            "limits": {"local_copy_bytes_per_second": {"elephant": 9e8},
                       "destination_write_bytes_per_second": 7e8}
        });
        let run = RunRow {
            id: 7,
            kind: "matrix".into(),
            status: "partial".into(),
            started_at: 1.8e9,
            ended_at: None,
            updated_at: 1.8e9,
            command: "longhaul matrix".into(),
            local_host: "alpha".into(),
            remote_host: None,
            export: None,
            grant: None,
            source: None,
            dest: None,
            bytes: None,
            files: None,
            seconds: None,
            bits_per_second: None,
            verified: None,
            verdict: None,
            live_bytes: 0,
            live_files: 0,
            live_bps: None,
            error: None,
            exit_code: None,
            lost: 0,
            dry_run: false,
        };
        (run, Document::from_doc(&doc).unwrap())
    }

    #[test]
    fn a_tool_named_like_markup_is_text_in_the_svg() {
        let (run, m) = matrix("<script>alert(1)</script>");
        let svg = svg_string(&run, &m).unwrap();
        assert!(!svg.contains("<script"), "markup from a tool name");
        assert!(!svg.contains("<b>"), "markup from a settings name");
        assert!(svg.contains("&lt;script&gt;"), "the name is not drawn");
        assert!(svg.contains("elephant: one large file"));
        assert!(svg.contains("Gbit/s"));
        assert_eq!(
            counts(&m),
            Counts {
                cells: 5,
                panels: 2
            }
        );
    }

    #[test]
    fn a_matrix_draws_to_png_and_an_empty_one_is_told() {
        let (run, m) = matrix("longhaul");
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("m.png");
        render(&run, &m, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let decoder = png::Decoder::new(bytes.as_slice());
        let reader = decoder.read_info().unwrap();
        assert_eq!(reader.info().width, WIDTH);
        assert_eq!(reader.info().height, height(&m));
        let empty = Document::default();
        let e = render(&run, &empty, &t.path().join("e.svg")).unwrap_err();
        assert!(matches!(e, PlotError::NoCells(7)), "{e}");
        assert!(render(&run, &m, &t.path().join("m.txt")).is_err());
    }
}
