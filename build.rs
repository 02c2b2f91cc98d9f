//! Records the target triple, so that a platform without a pinned CPU plugin gets an error that
//! names it. The plugin itself is fetched at run time, not here: see `src/runtime/install.rs`.

fn main() {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "an unknown target".into());
    println!("cargo:rustc-env=STABLEGRAPH_BUILD_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
