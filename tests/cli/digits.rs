//! The `digits` example as a user runs it: a CNN trained on scikit-learn's 8x8 digits reaches at
//! least 97% test accuracy on its fixed split (the bar), its confusion matrix counts every
//! test image, and the per-example gradient norms it prints are largest for images it gets wrong.

use super::{build_example, text};
use std::process::Command;

#[test]
fn digits_trains_to_97_percent_and_reports() {
    let out = Command::new(build_example("digits"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running the digits example");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let accuracy: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("test accuracy "))
        .and_then(|l| l.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no test accuracy in:\n{stdout}"));
    assert!(accuracy >= 97.0, "test accuracy {accuracy}%:\n{stdout}");
    // The confusion matrix: ten rows of ten counts after the header, 360 images in all.
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("confusion"))
        .expect("a confusion matrix");
    let total: usize = lines[at + 2..at + 12]
        .iter()
        .flat_map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|c| c.parse::<usize>().unwrap())
        })
        .sum();
    assert_eq!(total, 360, "{stdout}");
    // The image with the largest gradient norm is one the model gets wrong (label != predicted):
    // a correct, confident prediction has a near-zero loss gradient.
    let top = lines
        .iter()
        .position(|l| l.starts_with("largest per-example"))
        .map(|i| lines[i + 1])
        .expect("per-example gradient norms");
    let fields: Vec<&str> = top.split_whitespace().collect();
    assert_ne!(
        fields[1], fields[2],
        "the largest gradient norm is a correct image: {top}"
    );
}
