//! Progress on a terminal (indicatif): the benches' bars share one [`MultiProgress`] on stderr,
//! which hides itself when stderr is not a terminal (or `TERM=dumb`), so logs and pipes get the
//! plain lines only. Bars redraw when they move, between timed calls; only a bar made with
//! [`ticking`] also redraws once a second (its clock), which costs the timed runs next to
//! nothing.
//!
//! While a bar is drawn, lines go through [`out`] (stdout) and [`note`] (stderr), which print
//! them above the bars.

use std::fmt::Display;
use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bars of this process.
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// A bar over `len` units with `template` (indicatif's keys: `{wide_bar}`, `{pos}`, `{len}`,
/// `{eta}`, `{elapsed}`, `{msg}`), below the bars already shown. Finish it with
/// `finish_and_clear`, or [`done`] to also take it off the list.
pub fn bar(len: u64, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bars().add(ProgressBar::new(len).with_style(style))
}

/// `bar`, redrawn once a second when it is shown, so that an `{elapsed}` in it keeps time.
pub fn ticking(bar: ProgressBar) -> ProgressBar {
    if !bar.is_hidden() {
        bar.enable_steady_tick(std::time::Duration::from_secs(1));
    }
    bar
}

/// Clears `bar` and removes it from the list of bars shown.
pub fn done(bar: &ProgressBar) {
    bar.finish_and_clear();
    bars().remove(bar);
}

/// Prints `line` on stdout, above the bars.
pub fn out(line: impl Display) {
    bars().suspend(|| println!("{line}"));
}

/// Prints `line` on stderr, above the bars.
pub fn note(line: impl Display) {
    bars().suspend(|| eprintln!("{line}"));
}
