//! The house rules, checked on the source itself in [`DIRS`] (the library, and the examples and
//! benches that users read first): no function longer than [`MAX_FN_LINES`] lines and no file
//! longer than [`MAX_FILE_LINES`] lines, test code aside (items under `#[cfg(test)]` and files
//! named `tests.rs`). A long function is split by meaning (helpers named for what they do), a
//! long file into modules named for what they hold.
//!
//! A function is measured from its signature to its closing brace (doc comments and attributes
//! not counted); a file by its lines less those of its `#[cfg(test)]` items.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The directories held to the rules, relative to the crate root (recursively).
const DIRS: &[&str] = &["src", "examples", "benches"];
/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 100;
/// The longest a file may be, in lines of non-test code.
const MAX_FILE_LINES: usize = 800;

/// Offenders tolerated for a while (say why beside each), as (path under the crate root, item):
/// a function's path as this test names it (`Type::method`, `outer::inner`), or `FILE` for the
/// file's length. Each entry must still exceed its limit, so that the list cannot go stale:
/// delete an entry when its item is fixed. Empty today.
const ALLOWED: &[(&str, &str)] = &[];

/// One item over its limit.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Offence {
    path: String,
    item: String,
    lines: usize,
    limit: usize,
}

/// Whether `attrs` hold `#[cfg(test)]` or `#[cfg(all(test, ...))]`: code compiled for tests
/// only.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let Ok(list) = a.meta.require_list() else {
            return false;
        };
        let cond: String = list.tokens.to_string().split_whitespace().collect();
        a.path().is_ident("cfg")
            && (cond == "test"
                || (cond.starts_with("all(")
                    && cond[4..]
                        .trim_end_matches(')')
                        .split(',')
                        .any(|w| w == "test")))
    })
}

/// The lines a span covers, first and last included.
fn lines_of(span: proc_macro2::Span) -> (usize, usize) {
    (span.start().line, span.end().line)
}

/// Walks one file: the functions (with their enclosing type or function, for the name) and the
/// lines of its test-only items.
#[derive(Default)]
struct Measure {
    scope: Vec<String>,
    functions: Vec<(String, usize)>,
    test_lines: usize,
}

impl Measure {
    fn function(&mut self, name: &syn::Ident, sig: &syn::Signature, body: &syn::Block) {
        let first = sig.span().start().line;
        let last = body.brace_token.span.close().end().line;
        let mut path = self.scope.clone();
        path.push(name.to_string());
        self.functions.push((path.join("::"), last + 1 - first));
    }

    /// Counts a test-only item's lines (attributes included) and reports whether it was one.
    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        if !is_test_only(attrs) {
            return false;
        }
        let (mut first, last) = lines_of(span);
        if let Some(a) = attrs.first() {
            first = first.min(a.span().start().line);
        }
        self.test_lines += last + 1 - first;
        true
    }
}

/// The name a `impl` block's methods are reported under: the last segment of its type.
fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| "_".to_string(), |s| s.ident.to_string()),
        syn::Type::Reference(r) => type_name(&r.elem),
        _ => "_".to_string(),
    }
}

impl<'ast> Visit<'ast> for Measure {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => &[],
        };
        if self.skip_test(attrs, item.span()) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, &f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.scope.push(type_name(&i.self_ty));
        syn::visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.scope.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.scope.pop();
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.scope.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.scope.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if self.skip_test(&f.attrs, f.span()) {
            return;
        }
        self.function(&f.sig.ident, &f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if self.skip_test(&f.attrs, f.span()) {
            return;
        }
        if let Some(body) = &f.default {
            self.function(&f.sig.ident, &f.sig, body);
        }
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_trait_item_fn(self, f);
        self.scope.pop();
    }
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries {
            let path = e.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The functions and files of [`DIRS`] over their limits, by path relative to the crate root.
fn offences(root: &Path) -> Vec<Offence> {
    let mut found = Vec::new();
    for file in DIRS.iter().flat_map(|d| rust_files(&root.join(d))) {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let rel = file
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel} does not parse: {e}"));
        let mut m = Measure::default();
        m.visit_file(&ast);
        let code_lines = text.lines().count() - m.test_lines;
        if code_lines > MAX_FILE_LINES {
            found.push(Offence {
                path: rel.clone(),
                item: "FILE".into(),
                lines: code_lines,
                limit: MAX_FILE_LINES,
            });
        }
        for (item, lines) in m.functions {
            if lines > MAX_FN_LINES {
                found.push(Offence {
                    path: rel.clone(),
                    item,
                    lines,
                    limit: MAX_FN_LINES,
                });
            }
        }
    }
    found.sort();
    found
}

#[test]
fn no_long_functions_or_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = offences(root);
    let mut report = String::new();
    for o in &found {
        if !ALLOWED.contains(&(o.path.as_str(), o.item.as_str())) {
            let what = if o.item == "FILE" {
                "file".to_string()
            } else {
                format!("fn {}", o.item)
            };
            let _ = writeln!(
                report,
                "{}: {what} is {} lines (at most {})",
                o.path, o.lines, o.limit
            );
        }
    }
    for (path, item) in ALLOWED {
        if !found.iter().any(|o| o.path == *path && o.item == *item) {
            let _ = writeln!(
                report,
                "{path}: {item} is allowed to be long but no longer is (or is gone): remove it \
                 from ALLOWED in tests/house.rs"
            );
        }
    }
    assert!(
        report.is_empty(),
        "house rules broken in {}:\n{report}",
        DIRS.join(", ")
    );
}

/// The checker itself catches what it should and spares test code.
#[test]
fn the_checker_measures_functions_and_skips_tests() {
    let body = "    let x = 1;\n".repeat(101);
    let text = format!(
        "struct S;\nimpl S {{\n    fn long(&self) {{\n{body}    }}\n    fn short() {{}}\n}}\n\
         fn outer() {{\n    fn inner() {{\n{body}    }}\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn also_long() {{\n{body}    }}\n}}\n"
    );
    let ast = syn::parse_file(&text).expect("parses");
    let mut m = Measure::default();
    m.visit_file(&ast);
    let long: Vec<(&str, usize)> = m
        .functions
        .iter()
        .filter(|(_, n)| *n > MAX_FN_LINES)
        .map(|(f, n)| (f.as_str(), *n))
        .collect();
    assert_eq!(
        long,
        [("S::long", 103), ("outer", 105), ("outer::inner", 103)]
    );
    assert_eq!(m.test_lines, 106);
}
