//! The sweep's plot, drawn with plotters as SVG: perplexity (± error) and, when known, mean KL
//! divergence from the base against bits per weight. Unquantized files (the base) are horizontal
//! reference lines, so the x axis spans the quantized files only; each point's label goes where it
//! overlaps no other label, marker, error bar, line or the legend.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One file of the plot.
#[derive(Clone, Debug)]
pub struct PlotPoint {
    pub label: String,
    pub bpw: f64,
    pub ppl: f64,
    pub ppl_err: f64,
    /// Mean KL divergence from the base (`None`: not compared).
    pub kl_mean: Option<f64>,
    /// A horizontal reference line (the base, or another unquantized file) instead of a point
    pub reference: bool,
    /// Quantized with an importance matrix: drawn with a triangle instead of a circle
    pub imatrix: bool,
    /// Made by `quantize --target-bpw` (deltaq's own recipe): drawn in another colour
    pub target_bpw: bool,
}

/// A box in pixels, `x0 < x1`, `y0 < y1` (y grows downwards).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rect {
    pub x0: f64,
    pub y0: f64,
    pub x1: f64,
    pub y1: f64,
}

impl Rect {
    fn around(x: f64, y: f64, r: f64) -> Rect {
        Rect {
            x0: x - r,
            y0: y - r,
            x1: x + r,
            y1: y + r,
        }
    }

    /// The area both boxes cover.
    pub fn overlap(&self, o: &Rect) -> f64 {
        let w = self.x1.min(o.x1) - self.x0.max(o.x0);
        let h = self.y1.min(o.y1) - self.y0.max(o.y0);
        if w > 0.0 && h > 0.0 {
            w * h
        } else {
            0.0
        }
    }

    /// The area of `self` outside `o`.
    pub fn outside(&self, o: &Rect) -> f64 {
        (self.x1 - self.x0) * (self.y1 - self.y0) - self.overlap(o)
    }
}

/// Point labels' size as plotters takes it; SVG gets it divided by 1.24 (plotters' convention).
const LABEL_SIZE: f64 = 16.0;

/// The box a label's text covers, drawn with its top-left corner at (0, 0): a generous estimate
/// (0.68 em per character, about the widest of capitals, digits and `_` in common sans-serif fonts;
/// the line from the cap height to below the baseline).
pub fn label_size(text: &str) -> (f64, f64) {
    let em = LABEL_SIZE / 1.24;
    (0.68 * em * text.chars().count() as f64, em)
}

/// Boxes for labels of `sizes` beside the points at `anchors`, inside `area`, overlapping neither
/// `obstacles` nor each other: for each label in turn the first candidate that fits (above right of
/// its point first, as curves that fall to the right leave room there, then the other sides, then
/// farther out); the least overlapping candidate when none fits.
pub fn place_labels(
    area: Rect,
    anchors: &[(f64, f64)],
    sizes: &[(f64, f64)],
    obstacles: &[Rect],
) -> Vec<Rect> {
    let mut placed: Vec<Rect> = Vec::with_capacity(anchors.len());
    for (&(x, y), &(w, h)) in anchors.iter().zip(sizes) {
        let mut best: Option<(f64, Rect)> = None;
        'search: for gap in [5.0, 12.0, 22.0, 34.0, 50.0, 70.0] {
            let d = gap * 0.7;
            let tops_lefts = [
                (x + d, y - d - h),
                (x - d - w, y + d),
                (x - d - w, y - d - h),
                (x + d, y + d),
                (x + gap, y - h / 2.0),
                (x - gap - w, y - h / 2.0),
                (x - w / 2.0, y - gap - h),
                (x - w / 2.0, y + gap),
            ];
            for (left, top) in tops_lefts {
                let r = Rect {
                    x0: left,
                    y0: top,
                    x1: left + w,
                    y1: top + h,
                };
                let cost = r.outside(&area) * 10.0
                    + obstacles
                        .iter()
                        .chain(&placed)
                        .map(|o| r.overlap(o))
                        .sum::<f64>();
                if best.is_none_or(|(c, _)| cost < c) {
                    best = Some((cost, r));
                }
                if cost == 0.0 {
                    break 'search;
                }
            }
        }
        placed.push(best.expect("candidates were tried").1);
    }
    placed
}

const WIDTH: u32 = 800;
const PANEL_HEIGHT: u32 = 360;
const TITLE_HEIGHT: u32 = 36;
const LINE_COLOR: RGBColor = RGBColor(72, 120, 207);
const POINT_COLOR: RGBColor = RGBColor(214, 39, 40);
const REFERENCE_COLOR: RGBColor = RGBColor(90, 90, 90);
const TARGET_COLOR: RGBColor = RGBColor(44, 160, 44);

fn point_color(p: &PlotPoint) -> RGBColor {
    if p.target_bpw {
        TARGET_COLOR
    } else {
        POINT_COLOR
    }
}

/// What one panel shows: a value (in axis units) and its ± error per point.
struct Panel<'a> {
    y_desc: &'a str,
    value: fn(&PlotPoint) -> Option<(f64, f64)>,
    tick: fn(f64) -> String,
    legend: bool,
}

fn ppl_of(p: &PlotPoint) -> Option<(f64, f64)> {
    Some((p.ppl, p.ppl_err))
}

/// Mean KL divergence on a log10 axis (zero, the base against itself, has no place there).
fn kl_of(p: &PlotPoint) -> Option<(f64, f64)> {
    p.kl_mean.filter(|&k| k > 0.0).map(|k| (k.log10(), 0.0))
}

/// Draws the plot as a self-contained SVG document.
pub fn plot_svg(title: &str, points: &[PlotPoint]) -> Result<String, String> {
    let with_kl = points.iter().any(|p| kl_of(p).is_some());
    let n_panels = if with_kl { 2 } else { 1 };
    let height = TITLE_HEIGHT + n_panels * PANEL_HEIGHT;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        draw(&root, title, points, with_kl).map_err(|e| format!("drawing the plot: {e}"))?;
        root.present()
            .map_err(|e| format!("drawing the plot: {e}"))?;
    }
    Ok(svg)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    points: &[PlotPoint],
    with_kl: bool,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = root.titled(title, ("sans-serif", 20).into_font().style(FontStyle::Bold))?;
    let ppl = Panel {
        y_desc: "perplexity (± error)",
        value: ppl_of,
        tick: |v| format!("{v:.1}"),
        legend: true,
    };
    let kl = Panel {
        y_desc: "mean KL divergence from the base",
        value: kl_of,
        tick: |v| format!("{:.0e}", 10f64.powf(v)),
        legend: false,
    };
    if with_kl {
        let (top, bottom) = body.split_vertically(PANEL_HEIGHT);
        draw_panel(root, &top, points, &ppl)?;
        draw_panel(root, &bottom, points, &kl)?;
    } else {
        draw_panel(root, &body, points, &ppl)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    points: &[PlotPoint],
    panel: &Panel<'_>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let mut quantized: Vec<(&PlotPoint, f64, f64)> = points
        .iter()
        .filter(|p| !p.reference)
        .filter_map(|p| (panel.value)(p).map(|(v, e)| (p, v, e)))
        .collect();
    quantized.sort_by(|a, b| a.0.bpw.total_cmp(&b.0.bpw));
    let references: Vec<(&PlotPoint, f64)> = points
        .iter()
        .filter(|p| p.reference)
        .filter_map(|p| (panel.value)(p).map(|(v, _)| (p, v)))
        .collect();

    // x: the quantized files' range (all files' when none is quantized), padded for the labels
    let xs: Vec<f64> = if quantized.is_empty() {
        points.iter().map(|p| p.bpw).collect()
    } else {
        quantized.iter().map(|q| q.0.bpw).collect()
    };
    let (x_lo, x_hi) = padded(min(&xs), max(&xs), 0.08, 0.5);
    // y: every value with its error, and the reference lines; room above for the legend
    let ys: Vec<f64> = quantized
        .iter()
        .flat_map(|&(_, v, e)| [v - e, v + e])
        .chain(references.iter().map(|r| r.1))
        .collect();
    if ys.is_empty() {
        return Ok(());
    }
    let legend = if panel.legend {
        legend_entries(points)
    } else {
        Vec::new()
    };
    let (y_lo, mut y_hi) = padded(min(&ys), max(&ys), 0.06, 0.05);
    let plot_px = f64::from(PANEL_HEIGHT) - 60.0;
    let legend_px = legend_height(legend.len()) + 8.0;
    if legend_px > 8.0 {
        y_hi += (y_hi - y_lo) * legend_px / (plot_px - legend_px).max(1.0);
    }

    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("bits per weight")
        .y_desc(panel.y_desc)
        .x_label_formatter(&|v| format!("{v:.1}"))
        .y_label_formatter(&|v| (panel.tick)(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .draw()?;

    for &(_, v) in &references {
        chart.draw_series(DashedLineSeries::new(
            [(x_lo, v), (x_hi, v)],
            8,
            5,
            REFERENCE_COLOR.stroke_width(2),
        ))?;
    }
    chart.draw_series(LineSeries::new(
        quantized.iter().map(|&(p, v, _)| (p.bpw, v)),
        LINE_COLOR.stroke_width(2),
    ))?;
    for &(p, v, e) in &quantized {
        if e > 0.0 {
            chart.draw_series(LineSeries::new(
                [(p.bpw, v - e), (p.bpw, v + e)],
                BLACK.stroke_width(1),
            ))?;
        }
    }
    chart.draw_series(
        quantized
            .iter()
            .filter(|q| !q.0.imatrix)
            .map(|&(p, v, _)| Circle::new((p.bpw, v), 5, point_color(p).filled())),
    )?;
    chart.draw_series(
        quantized
            .iter()
            .filter(|q| q.0.imatrix)
            .map(|&(p, v, _)| TriangleMarker::new((p.bpw, v), 7, point_color(p).filled())),
    )?;

    // what the labels must not cover, in pixels
    let px = |x: f64, y: f64| {
        let (a, b) = chart.backend_coord(&(x, y));
        (f64::from(a), f64::from(b))
    };
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let plot = Rect {
        x0: f64::from(xr.start),
        y0: f64::from(yr.start),
        x1: f64::from(xr.end),
        y1: f64::from(yr.end),
    };
    let mut obstacles = Vec::new();
    let anchors: Vec<(f64, f64)> = quantized.iter().map(|&(p, v, _)| px(p.bpw, v)).collect();
    for (&(p, v, e), &(x, y)) in quantized.iter().zip(&anchors) {
        obstacles.push(Rect::around(x, y, 7.0));
        if e > 0.0 {
            let (_, top) = px(p.bpw, v + e);
            let (_, bottom) = px(p.bpw, v - e);
            obstacles.push(Rect {
                x0: x - 2.0,
                y0: top,
                x1: x + 2.0,
                y1: bottom,
            });
        }
    }
    for pair in anchors.windows(2) {
        obstacles.extend(segment_boxes(pair[0], pair[1]));
    }
    for &(_, v) in &references {
        let (_, y) = px(x_lo, v);
        obstacles.push(Rect {
            x0: plot.x0,
            y0: y - 2.0,
            x1: plot.x1,
            y1: y + 2.0,
        });
    }
    if !legend.is_empty() {
        let r = draw_legend(root, &plot, &legend)?;
        obstacles.push(r);
    }

    let sizes: Vec<(f64, f64)> = quantized.iter().map(|q| label_size(&q.0.label)).collect();
    let boxes = place_labels(plot, &anchors, &sizes, &obstacles);
    let style = ("sans-serif", LABEL_SIZE)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Top));
    for (q, r) in quantized.iter().zip(&boxes) {
        root.draw(&Text::new(
            q.0.label.clone(),
            (r.x0.round() as i32, r.y0.round() as i32),
            style.clone(),
        ))?;
    }
    Ok(())
}

/// A legend line: a marker (a circle, a triangle, a green square or a dashed line) and its text.
enum Key {
    Circle,
    Triangle,
    TargetBpw,
    Dashed,
}

fn legend_entries(points: &[PlotPoint]) -> Vec<(Key, String)> {
    let mut out = Vec::new();
    for p in points.iter().filter(|p| p.reference) {
        out.push((Key::Dashed, format!("{}: {:.2}", p.label, p.ppl)));
    }
    let quantized = |imatrix: bool| points.iter().any(|p| !p.reference && p.imatrix == imatrix);
    if quantized(false) {
        out.push((Key::Circle, "quantized".to_string()));
    }
    if quantized(true) {
        out.push((Key::Triangle, "quantized with an imatrix".to_string()));
    }
    if points.iter().any(|p| !p.reference && p.target_bpw) {
        out.push((Key::TargetBpw, "deltaq --target-bpw (green)".to_string()));
    }
    out
}

const LEGEND_LINE: f64 = 20.0;

fn legend_height(n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        n as f64 * LEGEND_LINE + 10.0
    }
}

/// Draws the legend in the plot's top right corner; the box it covers.
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    plot: &Rect,
    entries: &[(Key, String)],
) -> Result<Rect, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let text_w = entries
        .iter()
        .map(|(_, t)| label_size(t).0)
        .fold(0.0, f64::max);
    let w = 44.0 + text_w;
    let r = Rect {
        x0: plot.x1 - w - 6.0,
        y0: plot.y0 + 6.0,
        x1: plot.x1 - 6.0,
        y1: plot.y0 + 6.0 + legend_height(entries.len()),
    };
    let i = |v: f64| v.round() as i32;
    root.draw(&Rectangle::new(
        [(i(r.x0), i(r.y0)), (i(r.x1), i(r.y1))],
        WHITE.filled(),
    ))?;
    root.draw(&Rectangle::new(
        [(i(r.x0), i(r.y0)), (i(r.x1), i(r.y1))],
        BLACK.mix(0.3).stroke_width(1),
    ))?;
    let style = ("sans-serif", LABEL_SIZE)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (k, (key, text)) in entries.iter().enumerate() {
        let y = r.y0 + 5.0 + LEGEND_LINE * (k as f64 + 0.5);
        let x = r.x0 + 18.0;
        match key {
            Key::Circle => root.draw(&Circle::new((i(x), i(y)), 5, POINT_COLOR.filled()))?,
            Key::Triangle => {
                root.draw(&TriangleMarker::new((i(x), i(y)), 7, POINT_COLOR.filled()))?
            }
            Key::TargetBpw => root.draw(&Rectangle::new(
                [(i(x - 5.0), i(y - 5.0)), (i(x + 5.0), i(y + 5.0))],
                TARGET_COLOR.filled(),
            ))?,
            Key::Dashed => {
                for dx in [-12.0, -2.0, 8.0] {
                    root.draw(&PathElement::new(
                        [(i(x + dx), i(y)), (i(x + dx + 6.0), i(y))],
                        REFERENCE_COLOR.stroke_width(2),
                    ))?;
                }
            }
        }
        root.draw(&Text::new(text.clone(), (i(x + 20.0), i(y)), style.clone()))?;
    }
    Ok(r)
}

/// Small boxes along a line segment, so that labels keep off the line.
fn segment_boxes(a: (f64, f64), b: (f64, f64)) -> Vec<Rect> {
    let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
    let n = (len / 4.0).ceil().max(1.0) as usize;
    (0..=n)
        .map(|k| {
            let t = k as f64 / n as f64;
            Rect::around(a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), 2.0)
        })
        .collect()
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// `[lo, hi]` widened by `frac` of its span on each side; a span of zero by `flat` instead.
fn padded(lo: f64, hi: f64, frac: f64, flat: f64) -> (f64, f64) {
    let span = hi - lo;
    if span <= f64::EPSILON * hi.abs().max(1.0) {
        let pad = (hi.abs() * flat).max(flat);
        (lo - pad, hi + pad)
    } else {
        (lo - span * frac, hi + span * frac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_of_crowded_points_do_not_overlap_and_stay_inside() {
        let area = Rect {
            x0: 80.0,
            y0: 20.0,
            x1: 780.0,
            y1: 320.0,
        };
        // eight points a few pixels apart along a falling line, as close quant types give
        let anchors: Vec<(f64, f64)> = (0..8)
            .map(|i| (300.0 + 9.0 * i as f64, 100.0 + 6.0 * i as f64))
            .collect();
        let labels = [
            "Q4_K_S", "Q4_K_M", "Q4_1", "Q5_0", "Q5_K_S", "Q5_K_M", "Q5_1", "Q6_K",
        ];
        let sizes: Vec<_> = labels.iter().map(|l| label_size(l)).collect();
        let obstacles: Vec<Rect> = anchors
            .iter()
            .map(|&(x, y)| Rect::around(x, y, 7.0))
            .collect();
        let boxes = place_labels(area, &anchors, &sizes, &obstacles);
        for (i, a) in boxes.iter().enumerate() {
            assert_eq!(a.outside(&area), 0.0, "{a:?}");
            for o in &obstacles {
                assert_eq!(a.overlap(o), 0.0, "label {i} {a:?} covers a point {o:?}");
            }
            for b in &boxes[i + 1..] {
                assert_eq!(a.overlap(b), 0.0, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn the_x_axis_spans_the_quantized_files_and_references_are_lines() {
        let p = |label: &str, bpw: f64, ppl: f64, kl: Option<f64>, reference: bool| PlotPoint {
            label: label.into(),
            bpw,
            ppl,
            ppl_err: 0.5,
            kl_mean: kl,
            reference,
            imatrix: label.starts_with("IQ") || label.starts_with("target"),
            target_bpw: label.starts_with("target"),
        };
        let points = [
            p("F32", 32.0, 47.19, None, true),
            p("Q8_0", 8.55, 47.17, Some(0.0006), false),
            p("Q4_K_M", 5.13, 47.38, Some(0.02), false),
            p("IQ4_XS", 4.46, 47.9, Some(0.04), false),
            p("target 3.5 imatrix", 3.5, 48.5, Some(0.1), false),
        ];
        let svg = plot_svg("t", &points).unwrap();
        // tick labels stop near 8.55 bpw: nothing close to 32
        assert!(!svg.contains(">30.0<") && !svg.contains(">32.0<"));
        assert!(svg.contains("F32: 47.19"), "the base in the legend");
        assert!(svg.contains("quantized with an imatrix"));
        assert!(
            svg.contains("--target-bpw"),
            "the target-bpw files in the legend"
        );
        assert!(
            svg.contains("<polygon") || svg.contains("<polyline"),
            "{svg}"
        );
    }
}
