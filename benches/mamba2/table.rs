//! The printed tables of the report.

use std::fmt::Write as _;

use crate::common::progress;

/// A printed table: first column left-aligned, the others right-aligned.
pub struct Table {
    title: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with a title and column heads.
    pub fn new(title: impl Into<String>, head: &[&str]) -> Table {
        Table {
            title: title.into(),
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row of cells.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints the title and the aligned rows.
    pub fn print(&self) {
        let cols = self.head.len();
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .chain(std::iter::once(&self.head))
                    .map(|r| r.get(c).map_or(0, String::len))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        progress::out(format!("\n{}", self.title));
        for r in std::iter::once(&self.head).chain(&self.rows) {
            let mut line = String::new();
            for (c, w) in width.iter().enumerate() {
                let cell = r.get(c).map_or("", String::as_str);
                if c == 0 {
                    let _ = write!(line, "{cell:<w$}");
                } else {
                    let _ = write!(line, "  {cell:>w$}");
                }
            }
            progress::out(line.trim_end());
        }
    }
}
