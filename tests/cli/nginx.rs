//! Two `serve` replicas behind nginx, configured as `docs/serving.md` shows: greedy completions
//! from several threads all answered 200 with their tokens, equal whichever replica served them,
//! and both replicas serving; then one replica killed (SIGKILL) under load, with a long stream
//! held open on it: every request that starts after it is gone succeeds on the other (nginx
//! retries a refused connection), and the only failures are requests in flight on it when it
//! died (the held stream among them: cut, which its client sees).
//!
//! Skipped, with a note on stderr, where nginx is not installed, unless `CI` is set (then it
//! fails: `.ci/run` installs nginx).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::serve::Server;

/// Slots of each replica; during the kill, the client threads and the held stream, so that at
/// most this many requests can be in flight on the killed replica.
const SLOTS: usize = 4;
/// New tokens of a whole reply, of a streamed one, and of the stream held on the victim.
const WHOLE: usize = 8;
const STREAMED: usize = 128;
const HELD: usize = 2000;

/// Prompts, each sent many times (greedy: every reply to one prompt is the same).
const PROMPTS: [&str; 8] = [
    "fn main() {",
    "let x = ",
    "impl Drop for ",
    "use std::",
    "/// Returns the ",
    "self.state",
    "match x {\n",
    "pub(crate) fn ",
];

/// The nginx binary: on `PATH`, or where Debian puts it (`/usr/sbin`, not on users' `PATH`).
fn nginx_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// A port free a moment ago on 127.0.0.1 (bound to 0, then released).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The nginx config: one upstream of both replicas, POSTs retried on the other replica when a
/// connection fails, streams passed on as they come, every file inside `dir`.
fn config(dir: &Path, port: u16, upstreams: &[&str]) -> String {
    let d = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u} max_fails=1 fail_timeout=10s;\n"))
        .collect();
    format!(
        "daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    log_format upstream '$status $upstream_addr $upstream_status $request_time';
    access_log {d}/access.log upstream;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream stablegraph {{
{servers}        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://stablegraph;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_connect_timeout 5s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries 2;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"
    )
}

/// nginx in the foreground on a free port of 127.0.0.1, its files in a fresh temporary
/// directory; killed when dropped (its directory kept, and its error log printed, on a panic).
struct Nginx {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Nginx {
    fn start(bin: &Path, upstreams: &[&str]) -> Nginx {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let dir = std::env::temp_dir().join(format!(
            "stablegraph-nginx-{}-{}",
            std::process::id(),
            nanos.as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        // The port may be taken between finding it and nginx binding it: then try another.
        for _ in 0..5 {
            let port = free_port();
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, config(&dir, port, upstreams)).unwrap();
            let _ = std::fs::remove_file(dir.join("error.log"));
            let mut child = Command::new(bin)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(dir.join("error.log"))
                .stdout(Stdio::null())
                .stderr(File::create(dir.join("stderr.log")).unwrap())
                .spawn()
                .expect("starting nginx");
            let url = format!("http://127.0.0.1:{port}");
            if healthy(&mut child, &url) {
                return Nginx { child, dir, url };
            }
            let log = ["stderr.log", "error.log"]
                .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
                .concat();
            assert!(log.contains("Address already in use"), "nginx: {log}");
        }
        panic!("nginx found no free port in 5 tries");
    }

    /// Requests of the access log that nginx passed to more than one replica.
    fn retried(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains(", ")).count()
    }
}

/// Waits until `/health` answers 200 at `url` (true), or `child` exits (false).
fn healthy(child: &mut Child, url: &str) -> bool {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        let r = ureq::get(&format!("{url}/health"))
            .timeout(Duration::from_secs(5))
            .call();
        if r.is_ok_and(|r| r.status() == 200) {
            return true;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("nginx did not answer /health in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "nginx's files are in {}; its error log ends:",
                self.dir.display()
            );
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The `token_ids` of a choice.
fn token_ids(v: &Value) -> Vec<u32> {
    let ids = v["choices"][0]["token_ids"].as_array();
    ids.map_or_else(Vec::new, |a| {
        a.iter().map(|t| t.as_u64().unwrap() as u32).collect()
    })
}

/// A reply through nginx: the replica that answered (the last of `X-Upstream`, which lists
/// every one tried; empty without a reply), and its tokens or what went wrong.
struct Reply {
    upstream: String,
    result: Result<Vec<u32>, String>,
}

/// Posts a greedy completion of `prompt` for `n` tokens through `url`, streamed or whole.
fn post(agent: &ureq::Agent, url: &str, prompt: &str, n: usize, stream: bool) -> Reply {
    let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream});
    let sent = agent
        .post(&format!("{url}/v1/completions"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let (r, code) = match sent {
        Ok(r) => (r, 200),
        Err(ureq::Error::Status(code, r)) => (r, code),
        Err(e) => {
            let result = Err(format!("no reply: {e}"));
            return Reply {
                upstream: String::new(),
                result,
            };
        }
    };
    let upstream = r.header("X-Upstream").unwrap_or_default();
    let upstream = upstream.rsplit(", ").next().unwrap().to_string();
    let result = match (code, stream) {
        (200, true) => read_stream(BufReader::new(r.into_reader()).lines()),
        (200, false) => match r.into_string() {
            Ok(text) => serde_json::from_str(&text)
                .map(|v| token_ids(&v))
                .map_err(|e| format!("{e}: {text:?}")),
            Err(e) => Err(format!("reply cut: {e}")),
        },
        _ => Err(format!("{code}: {}", r.into_string().unwrap_or_default())),
    };
    let result = result.and_then(|ids| match ids.len() == n {
        true => Ok(ids),
        false => Err(format!("{} tokens, not {n}", ids.len())),
    });
    Reply { upstream, result }
}

/// The tokens of a stream's events, when it ends with `[DONE]`; otherwise where it was cut.
fn read_stream(lines: impl Iterator<Item = std::io::Result<String>>) -> Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    for line in lines {
        let cut = |e: &dyn std::fmt::Display| format!("stream cut after {} tokens: {e}", ids.len());
        let line = line.map_err(|e| cut(&e))?;
        match line.strip_prefix("data: ") {
            Some("[DONE]") => return Ok(ids),
            Some(data) => {
                let v: Value = serde_json::from_str(data).map_err(|e| cut(&e))?;
                ids.extend(token_ids(&v));
            }
            None => {}
        }
    }
    Err(format!(
        "stream ended without [DONE] after {} tokens",
        ids.len()
    ))
}

/// A replica's `stablegraph_requests_total{outcome="completed"}`.
fn completed(server: &Server) -> u64 {
    let metrics = server.get("/metrics", None).unwrap();
    let line = metrics
        .lines()
        .find_map(|l| l.strip_prefix("stablegraph_requests_total{outcome=\"completed\"} "));
    line.map_or(0, |n| n.trim().parse().unwrap())
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        .build()
}

/// One request of the load: when it started and ended, whether it streamed, and its reply.
struct Sent {
    start: Instant,
    end: Instant,
    stream: bool,
    reply: Reply,
}

/// The kill: when SIGKILL was sent, and when the replica was reaped (its sockets closed).
struct Kill {
    sent: Instant,
    dead: Instant,
}

#[test]
fn two_replicas_behind_nginx_share_the_load_and_survive_one_killed() {
    let Some(bin) = nginx_binary() else {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        assert!(
            !ci,
            "nginx is not installed and CI is set: install it (.ci/run does)"
        );
        eprintln!(
            "skipped: nginx is not installed (not on PATH nor in /usr/sbin); install it (Debian: \
             apt-get install nginx) to run this test; with CI set it fails instead"
        );
        return;
    };
    let t0 = Instant::now();
    let slots = SLOTS.to_string();
    let args = ["--slots", slots.as_str()];
    let (survivor, victim) = std::thread::scope(|s| {
        let other = s.spawn(|| Server::start(&args));
        let one = Server::start(&args);
        (one, other.join().unwrap())
    });
    let addrs = [
        survivor.host_port().to_string(),
        victim.host_port().to_string(),
    ];
    let nginx = Nginx::start(&bin, &[&addrs[0], &addrs[1]]);
    let up = t0.elapsed();
    let t1 = Instant::now();
    let refs = share_the_load(&nginx, [&survivor, &victim]);
    let shared = t1.elapsed();
    let before = completed(&survivor);
    let t2 = Instant::now();
    let (sent, kill) = kill_under_load(&nginx, victim, &addrs[1], &refs);
    let failed = check_the_kill(&sent, &kill, &addrs);
    // The survivor completed every request that started after the kill.
    let after = sent.iter().filter(|r| r.start > kill.dead).count() as u64;
    let gained = completed(&survivor) - before;
    assert!(
        gained >= after,
        "the survivor completed {gained} of {after}"
    );
    let streams = sent.iter().filter(|r| r.stream).count();
    eprintln!(
        "nginx: replicas and nginx up in {:.1} s; 32 requests shared in {:.1} s; under load {} \
         requests ({streams} streamed) in {:.1} s, {after} after the kill; {} failed, all in \
         flight on the killed replica: {failed:?}; nginx passed {} to the other replica",
        up.as_secs_f64(),
        shared.as_secs_f64(),
        sent.len(),
        t2.elapsed().as_secs_f64(),
        failed.len(),
        nginx.retried()
    );
}

/// 32 whole greedy completions from 4 threads through nginx, each prompt 4 times: every reply
/// 200 with its tokens, one prompt's replies equal whichever replica served them, and both
/// replicas serving. Returns each prompt's tokens.
fn share_the_load(nginx: &Nginx, replicas: [&Server; 2]) -> Vec<Vec<u32>> {
    let replies: Vec<(usize, Vec<u32>)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    let agent = agent();
                    let prompts = (0..PROMPTS.len()).map(|k| (t * 3 + k) % PROMPTS.len());
                    let sent =
                        prompts.map(|p| (p, post(&agent, &nginx.url, PROMPTS[p], WHOLE, false)));
                    sent.map(|(p, r)| (p, r.result.unwrap_or_else(|e| panic!("{e}"))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut refs: HashMap<usize, Vec<u32>> = HashMap::new();
    for (p, ids) in replies {
        let first = refs.entry(p).or_insert_with(|| ids.clone());
        assert_eq!(first, &ids, "two replies to {:?}", PROMPTS[p]);
    }
    let counts = replicas.map(completed);
    assert!(
        counts.iter().all(|&n| n > 0),
        "one replica served all: {counts:?}"
    );
    assert_eq!(counts[0] + counts[1], 32, "{counts:?}");
    (0..PROMPTS.len())
        .map(|p| refs.remove(&p).unwrap())
        .collect()
}

/// Greedy requests through nginx in a loop from `SLOTS - 1` client threads, streamed and whole
/// in turn, each checked against `refs`; once they flow, a long stream is opened on `victim`
/// (at `addr`) and `victim` killed while it runs; the load goes on for at least a second and 4
/// requests per client. Returns every request, the held stream last.
fn kill_under_load(
    nginx: &Nginx,
    victim: Server,
    addr: &str,
    refs: &[Vec<u32>],
) -> (Vec<Sent>, Kill) {
    let clients = SLOTS - 1;
    let stop = AtomicBool::new(false);
    let dead: OnceLock<Instant> = OnceLock::new();
    let (done, after) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut victim = Some(victim);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..clients)
            .map(|t| {
                let (stop, dead, done, after) = (&stop, &dead, &done, &after);
                s.spawn(move || {
                    let agent = agent();
                    let mut sent = Vec::new();
                    for k in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let (p, stream) = ((t * 3 + k) % PROMPTS.len(), (t + k) % 2 == 0);
                        let n = if stream { STREAMED } else { WHOLE };
                        let start = Instant::now();
                        let mut reply = post(&agent, &nginx.url, PROMPTS[p], n, stream);
                        if reply
                            .result
                            .as_ref()
                            .is_ok_and(|ids| ids[..WHOLE] != refs[p][..])
                        {
                            reply.result = Err(format!("tokens differ from {:?}", refs[p]));
                        }
                        let end = Instant::now();
                        done.fetch_add(1, Ordering::SeqCst);
                        if dead.get().is_some_and(|d| start > *d) {
                            after.fetch_add(1, Ordering::SeqCst);
                        }
                        sent.push(Sent {
                            start,
                            end,
                            stream,
                            reply,
                        });
                    }
                    sent
                })
            })
            .collect();
        let flowing = Instant::now();
        while done.load(Ordering::SeqCst) < 2 * clients || flowing.elapsed().as_millis() < 300 {
            assert!(flowing.elapsed().as_secs() < 120, "the load did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (held_start, lines) = stream_held_on(nginx, addr);
        let sent_at = Instant::now();
        drop(victim.take()); // SIGKILL, then reaped: its sockets are closed.
        let dead_at = Instant::now();
        dead.set(dead_at).unwrap();
        let held = Sent {
            start: held_start,
            end: Instant::now(),
            stream: true,
            reply: Reply {
                upstream: addr.to_string(),
                result: read_stream(lines),
            },
        };
        while dead_at.elapsed().as_secs() < 1 || after.load(Ordering::SeqCst) < 4 * clients {
            assert!(
                dead_at.elapsed().as_secs() < 120,
                "the load stalled after the kill"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
        let mut sent: Vec<Sent> = threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        sent.push(held);
        (
            sent,
            Kill {
                sent: sent_at,
                dead: dead_at,
            },
        )
    })
}

/// Opens streams of [`HELD`] tokens through nginx until one is served by `addr` (round robin:
/// every other one, give or take the load's), and returns its start and its lines once its
/// first event has arrived; the others are dropped (their clients gone, their slots freed).
fn stream_held_on(
    nginx: &Nginx,
    addr: &str,
) -> (Instant, impl Iterator<Item = std::io::Result<String>>) {
    let agent = agent();
    let body = json!({"prompt": PROMPTS[0], "max_tokens": HELD, "temperature": 0, "stream": true});
    for _ in 0..50 {
        let start = Instant::now();
        let r = agent
            .post(&format!("{}/v1/completions", nginx.url))
            .send_string(&body.to_string())
            .expect("a long stream");
        if r.header("X-Upstream") == Some(addr) {
            let mut lines = BufReader::new(r.into_reader()).lines();
            let first = lines.next().unwrap().unwrap();
            assert!(first.starts_with("data: {"), "{first}");
            return (start, lines);
        }
    }
    panic!("no stream of 50 was served by {addr}");
}

/// Checks that every failed request was in flight on the killed replica when it died (served
/// by it, or with no reply; started before it was reaped and ended after SIGKILL was sent),
/// the held stream among them, at most its [`SLOTS`]; and that every request started after it
/// was gone succeeded on the other (`addrs`: survivor, victim). Returns the failures' errors.
fn check_the_kill(sent: &[Sent], kill: &Kill, addrs: &[String; 2]) -> Vec<String> {
    let ms = |t: Instant| match t.checked_duration_since(kill.sent) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(kill.sent - t).as_secs_f64() * 1e3,
    };
    let failed: Vec<&Sent> = sent.iter().filter(|r| r.reply.result.is_err()).collect();
    for r in &failed {
        let on_victim = r.reply.upstream == addrs[1] || r.reply.upstream.is_empty();
        assert!(
            on_victim && r.start < kill.dead && r.end > kill.sent,
            "a request not in flight on the killed replica failed: served by {:?}, started \
             {:.0} ms and ended {:.0} ms from SIGKILL (reaped at {:.0} ms): {:?}",
            r.reply.upstream,
            ms(r.start),
            ms(r.end),
            ms(kill.dead),
            r.reply.result
        );
    }
    let held = sent.last().unwrap();
    assert!(
        held.reply.result.is_err(),
        "the stream held on the killed replica ended whole"
    );
    assert!(failed.len() <= SLOTS, "{} failed", failed.len());
    let after: Vec<&Sent> = sent.iter().filter(|r| r.start > kill.dead).collect();
    assert!(
        after.len() >= 4 * (SLOTS - 1),
        "{} requests after the kill",
        after.len()
    );
    for r in after {
        assert!(r.reply.result.is_ok(), "{:?}", r.reply.result);
        assert_eq!(r.reply.upstream, addrs[0]);
    }
    failed
        .iter()
        .map(|r| r.reply.result.clone().unwrap_err())
        .collect()
}
