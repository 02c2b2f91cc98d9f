//! Faults from outside the process: a compile-cache directory that another process corrupts or
//! deletes while this one reads it, and a plugin file swapped for another between two runs.

mod common;

use std::path::Path;

use common::TempDir;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stablegraph::runtime::{install, Client, CompileCache, Plugin};

/// Program `i`: `x * i + i`, each with its own text and so its own cache entry.
fn program(i: usize) -> String {
    format!(
        r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %k = stablehlo.constant dense<{i}.0> : tensor<4xf32>
  %y = stablehlo.multiply %x, %k : tensor<4xf32>
  %z = stablehlo.add %y, %k : tensor<4xf32>
  return %z : tensor<4xf32>
}}"#
    )
}

/// A client of the CPU plugin whose compile cache is `dir` (its own memory cache is empty, so
/// every compile goes to the disk first).
fn client_with_cache(dir: &Path) -> Client {
    let plugin = Plugin::load(install::resolve_cpu_plugin().unwrap()).unwrap();
    let client = Client::new(&plugin, &[]).unwrap();
    client.set_compile_cache(CompileCache::in_dir(dir));
    client
}

/// Compiles and runs programs `0..n` on `client`, checking every result.
fn compile_and_run_all(client: &Client, n: usize) {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let xb = client.buffer_from_slice(&x, &[4]).unwrap();
    for i in 0..n {
        let exe = client
            .compile(&program(i))
            .unwrap_or_else(|e| panic!("program {i}: {e}"));
        let out = exe.execute(&[&xb]).unwrap()[0].to_vec::<f32>().unwrap();
        let k = i as f32;
        let want: Vec<f32> = x.iter().map(|v| v * k + k).collect();
        assert_eq!(out, want, "program {i}");
    }
}

/// Another process that, `rounds` times, overwrites part of every entry in `dir` with garbage
/// (rounds 0-4 of every 10), empties every entry (rounds 5-8), or deletes the whole directory
/// (round 9).
fn vandal(dir: &Path, rounds: usize) -> Child {
    let script = r#"
dir=$1; n=$2; i=0
while [ $i -lt $n ]; do
  for f in "$dir"/*.pjrt; do
    [ -e "$f" ] || continue
    case $((i % 10)) in
      [0-4]) printf 'garbage garbage garbage' | dd of="$f" bs=1 seek=100 conv=notrunc status=none ;;
      [5-8]) : > "$f" ;;
      9) rm -rf "$dir" ;;
    esac
  done
  i=$((i + 1))
  sleep 0.005
done
"#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("vandal")
        .arg(dir)
        .arg(rounds.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("sh must run")
}

#[test]
fn a_cache_dir_another_process_corrupts_or_deletes_only_costs_recompiles() {
    const N: usize = 6;
    let tmp = TempDir::new("faults-vandal");
    let dir = tmp.join("cache");

    // Fill the cache, then let another process corrupt every entry, and wait for it.
    let first = client_with_cache(&dir);
    compile_and_run_all(&first, N);
    assert_eq!(first.cache_stats().disk_writes, N as u64);
    let status = vandal(&dir, 1).wait().unwrap();
    assert!(status.success());
    let second = client_with_cache(&dir);
    compile_and_run_all(&second, N);
    let stats = second.cache_stats();
    assert_eq!(
        (stats.disk_hits, stats.disk_rejects, stats.compiles),
        (0, N as u64, N as u64),
        "every corrupted entry is refused and recompiled: {stats:?}"
    );

    // Now the other process truncates, corrupts and deletes while this one reads and writes.
    let mut child = vandal(&dir, 400);
    let start = Instant::now();
    let mut rounds = 0;
    let mut total = stablegraph::runtime::CacheStats::default();
    while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
        let client = client_with_cache(&dir);
        compile_and_run_all(&client, N);
        let s = client.cache_stats();
        total.disk_hits += s.disk_hits;
        total.disk_rejects += s.disk_rejects;
        total.compiles += s.compiles;
        total.disk_writes += s.disk_writes;
        total.disk_errors += s.disk_errors;
        rounds += 1;
    }
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "{rounds} rounds of {N} compiles while another process vandalised the cache: {total:?}"
    );
    assert!(rounds >= 2, "the other process finished before two rounds");
    // And once it has stopped, the cache works again: a full round writes, the next one hits.
    let _ = std::fs::remove_dir_all(&dir);
    compile_and_run_all(&client_with_cache(&dir), N);
    let last = client_with_cache(&dir);
    compile_and_run_all(&last, N);
    assert_eq!(last.cache_stats().disk_hits, N as u64);
}

/// Runs this test binary's ignored `child_run` as a separate process with `plugin` and `cache`,
/// and returns its exit status and output.
fn run_child(plugin: &Path, cache: &Path) -> (bool, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_run", "--nocapture"])
        .env("STABLEGRAPH_PJRT_PLUGIN", plugin)
        .env("STABLEGRAPH_CACHE_DIR", cache)
        .env_remove("STABLEGRAPH_CACHE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The child's cache counters, from its `stats:` line.
fn child_stats(output: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix("stats: "))
        .unwrap_or_else(|| panic!("no stats line in:\n{output}"))
        .to_string()
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "pjrt"))
            })
            .count()
        })
        .unwrap_or(0)
}

/// One run of a program, as a separate process (see `run_child`).
#[test]
#[ignore = "run as a child process by a_plugin_swapped_between_runs_gets_new_cache_entries"]
fn child_run() {
    let client = Client::cpu().unwrap();
    compile_and_run_all(&client, 1);
    let s = client.cache_stats();
    println!(
        "stats: compiles={} disk_hits={} disk_writes={}",
        s.compiles, s.disk_hits, s.disk_writes
    );
}

#[test]
fn a_plugin_swapped_between_runs_gets_new_cache_entries() {
    let tmp = TempDir::new("faults-swap");
    let cache = tmp.join("cache");
    let plugin = tmp.join("plugin.so");
    let real = install::resolve_cpu_plugin().unwrap();
    let bytes = std::fs::read(&real).unwrap();
    std::fs::write(&plugin, &bytes).unwrap();

    let (ok, out) = run_child(&plugin, &cache);
    assert!(ok, "{out}");
    assert_eq!(child_stats(&out), "compiles=1 disk_hits=0 disk_writes=1");
    let (ok, out) = run_child(&plugin, &cache);
    assert!(ok, "{out}");
    assert_eq!(child_stats(&out), "compiles=0 disk_hits=1 disk_writes=0");
    assert_eq!(entries(&cache), 1);

    // Another file at the same path (the same code with a byte appended: a different build to
    // anyone looking): the old entry is not used, a new one is written.
    std::fs::remove_file(&plugin).unwrap();
    let mut other = bytes.clone();
    other.push(0);
    std::fs::write(&plugin, &other).unwrap();
    let (ok, out) = run_child(&plugin, &cache);
    assert!(ok, "{out}");
    assert_eq!(child_stats(&out), "compiles=1 disk_hits=0 disk_writes=1");
    assert_eq!(entries(&cache), 2);

    // A file that is no plugin at all: a clear error, no crash, the cache untouched.
    std::fs::remove_file(&plugin).unwrap();
    std::fs::write(&plugin, b"not a shared object").unwrap();
    let (ok, out) = run_child(&plugin, &cache);
    assert!(!ok, "a run with a broken plugin succeeded:\n{out}");
    assert!(
        out.contains("plugin.so") && !out.contains("SIGSEGV") && !out.contains("signal"),
        "the failure should name the plugin file and not be a crash:\n{out}"
    );
    assert_eq!(entries(&cache), 2);
}
