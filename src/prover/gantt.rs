//! A Gantt picture of a batch as SVG: one lane per worker, time left to right. The top
//! band of a lane shows lock waits and holds (mem blue, compute orange), the bottom band
//! what the worker does (CPU prep and B_G2 green, device stages grey, a fallback red), so
//! a reviewer sees at a glance whether mem holds sit under another worker's compute hold.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::timeline::{Phase, Span};
use crate::device::WorkerId;

const LANE: f64 = 34.0;
const LABEL: f64 = 90.0;
const WIDTH: f64 = 1200.0;
const TOP: f64 = 40.0;

/// (band, fill) of a phase: band 0 is the lock band, band 1 the work band.
fn style(p: Phase) -> (usize, &'static str) {
    match p {
        Phase::MemWait => (0, "#c6dbef"),
        Phase::MemHold => (0, "#2171b5"),
        Phase::ComputeWait => (0, "#fdd0a2"),
        Phase::ComputeHold => (0, "#e6550d"),
        Phase::PrepWait => (1, "#c7e9c0"),
        Phase::Prep | Phase::BG2 | Phase::Assemble => (1, "#31a354"),
        Phase::Fallback => (1, "#de2d26"),
        Phase::Upload => (1, "#9ecae1"),
        Phase::WitnessMap
        | Phase::MsmH
        | Phase::MsmL
        | Phase::MsmA
        | Phase::MsmBG1
        | Phase::Sync
        | Phase::Free => (1, "#969696"),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG document for `spans` under `title`.
pub fn svg(spans: &[Span], title: &str) -> String {
    let lanes: Vec<WorkerId> = spans
        .iter()
        .map(|s| s.worker)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let t0 = spans.iter().map(|s| s.start_us).min().unwrap_or(0);
    let t1 = spans
        .iter()
        .map(|s| s.end_us)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let scale = (WIDTH - LABEL - 10.0) / (t1 - t0) as f64;
    let height = TOP + LANE * lanes.len() as f64 + 60.0;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"##
    );
    let _ = writeln!(
        out,
        r##"<text x="4" y="16" font-size="13">{} ({:.1} ms)</text>"##,
        escape(title),
        (t1 - t0) as f64 / 1e3
    );
    for (i, w) in lanes.iter().enumerate() {
        let y = TOP + LANE * i as f64;
        let _ = writeln!(
            out,
            r##"<text x="4" y="{:.1}">{w}</text><line x1="{LABEL}" x2="{WIDTH}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            y + LANE / 2.0,
            y + LANE - 1.0,
            y + LANE - 1.0
        );
    }
    let mut sorted: Vec<&Span> = spans.iter().collect();
    // Holds after waits and kernels after their compute hold, so the finer spans stay on top.
    sorted.sort_by_key(|s| (s.start_us, std::cmp::Reverse(s.end_us)));
    for s in sorted {
        let Some(lane) = lanes.iter().position(|w| *w == s.worker) else {
            continue;
        };
        let (band, fill) = style(s.phase);
        let x = LABEL + (s.start_us - t0) as f64 * scale;
        let w = ((s.end_us.saturating_sub(s.start_us)) as f64 * scale).max(0.5);
        let y = TOP + LANE * lane as f64 + 2.0 + band as f64 * (LANE / 2.0 - 1.0);
        let _ = writeln!(
            out,
            r##"<rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}" fill="{fill}"><title>{} p{} {:.2} ms</title></rect>"##,
            LANE / 2.0 - 3.0,
            s.phase.name(),
            s.partition,
            (s.end_us.saturating_sub(s.start_us)) as f64 / 1e3
        );
    }
    let legend = [
        ("mem wait", "#c6dbef"),
        ("mem hold", "#2171b5"),
        ("compute wait", "#fdd0a2"),
        ("compute hold", "#e6550d"),
        ("prep wait", "#c7e9c0"),
        ("CPU (prep, B_G2, assemble)", "#31a354"),
        ("upload", "#9ecae1"),
        ("device stage", "#969696"),
        ("fallback", "#de2d26"),
    ];
    let ly = TOP + LANE * lanes.len() as f64 + 20.0;
    let mut x = LABEL;
    for (name, fill) in legend {
        let _ = writeln!(
            out,
            r##"<rect x="{x:.1}" y="{ly:.1}" width="12" height="12" fill="{fill}"/><text x="{:.1}" y="{:.1}">{name}</text>"##,
            x + 16.0,
            ly + 10.0
        );
        x += 30.0 + 6.5 * name.len() as f64;
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prover::timeline::test_span as span;

    #[test]
    fn one_lane_per_worker_and_every_span_drawn() {
        let spans = [
            span(0, Phase::ComputeHold, 100, 500),
            span(1, Phase::MemHold, 150, 480),
            span(1, Phase::Prep, 0, 150),
            span(2, Phase::MemWait, 160, 600),
        ];
        let svg = svg(&spans, "a <batch>");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        for lane in ["dev0/w0", "dev0/w1", "dev0/w2"] {
            assert_eq!(svg.matches(&format!(">{lane}<")).count(), 1, "{lane}");
        }
        assert_eq!(
            svg.matches("<rect").count(),
            spans.len() + 9,
            "spans + legend"
        );
        assert!(svg.contains("a &lt;batch&gt;"));
        assert!(svg.contains("#2171b5") && svg.contains("#e6550d"));
    }

    #[test]
    fn an_empty_timeline_is_still_a_document() {
        let svg = svg(&[], "empty");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
