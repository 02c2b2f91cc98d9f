//! Progress bars on stderr (indicatif) for the long commands, `train` and `bench`. A bar draws
//! only when stderr is a terminal (indicatif's stderr target hides itself otherwise, and for
//! `TERM=dumb`), so logs, pipes and CI keep the plain lines.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// A bar over `len` units on stderr with `template` (indicatif's keys: `{wide_bar}`, `{pos}`,
/// `{len}`, `{per_sec}`, `{eta}`, `{elapsed}`, `{msg}`), redrawn twice a second so that its
/// clock moves during long units. Dropped unfinished (an error), it clears itself.
pub(crate) fn bar(len: u64, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        .with_style(style)
        .with_finish(ProgressFinish::AndClear);
    if !bar.is_hidden() {
        bar.enable_steady_tick(Duration::from_millis(500));
    }
    bar
}
