//! XLA's own log: the absl/TSL messages a PJRT plugin writes to stderr (`I0000 ...`,
//! `W0000 ...`, `WARNING: All log messages before absl::InitializeLog() ...`), quiet unless
//! asked for.
//!
//! The XLA CPU plugins export only `GetPjrtApi`: their logging library is not reachable by
//! symbol, and PJRT has no logging option. Their one logging interface is the environment:
//! TSL's `TF_CPP_MIN_LOG_LEVEL` (0 info, 1 warnings, 2 errors, 3 fatal errors only). Both
//! pinned CPU plugins (`lammps-jax-pjrt-cpu` 0.11.2 and `xla-cpu-pjrt` 0.0.1; checked with
//! `generate --devices 2`) read it while the shared object is being loaded (in its static
//! initializers): setting it after `dlopen`, or between `dlopen` and `GetPjrtApi`, changes
//! nothing. So the level is chosen once per process, just before the first plugin is loaded
//! ([`super::Plugin::load`] calls [`apply_before_first_load`]).

use std::sync::Mutex;

/// How much of XLA's own log a process shows on stderr. The default is [`XlaLogLevel::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XlaLogLevel {
    /// Everything XLA logs at the info level and above (as an unconfigured plugin does: a line
    /// per client with `cpu_device_count`, Shardy notes per sharded compile).
    Info,
    /// Warnings and errors.
    Warning,
    /// Errors only (the default).
    Error,
    /// Nothing but fatal errors.
    Off,
}

impl XlaLogLevel {
    /// The level a `STABLEGRAPH_LOG` value names, ignoring case and surrounding spaces: `info`
    /// (also `verbose`, `debug`, `all`), `warning` (also `warn`), `error` (also the empty
    /// string), `off` (also `quiet`, `none`, `fatal`). `None` for anything else.
    pub fn parse(value: &str) -> Option<XlaLogLevel> {
        match value.trim().to_ascii_lowercase().as_str() {
            "info" | "verbose" | "debug" | "all" => Some(XlaLogLevel::Info),
            "warning" | "warn" => Some(XlaLogLevel::Warning),
            "error" | "" => Some(XlaLogLevel::Error),
            "off" | "quiet" | "none" | "fatal" => Some(XlaLogLevel::Off),
            _ => None,
        }
    }

    /// The `TF_CPP_MIN_LOG_LEVEL` value of this level: `"0"` to `"3"`.
    pub fn tf_cpp_min_log_level(self) -> &'static str {
        match self {
            XlaLogLevel::Info => "0",
            XlaLogLevel::Warning => "1",
            XlaLogLevel::Error => "2",
            XlaLogLevel::Off => "3",
        }
    }
}

/// What the process asked for, and whether the first plugin load has applied it.
struct State {
    requested: Option<XlaLogLevel>,
    applied: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    requested: None,
    applied: false,
});

/// Chooses XLA's log level for this process (the CLI's `--verbose` asks for
/// [`XlaLogLevel::Info`]), over `STABLEGRAPH_LOG` and `TF_CPP_MIN_LOG_LEVEL`. It takes effect
/// when the first plugin is loaded, so it must come before the first [`super::Plugin::load`]
/// (or `Client::cpu`, which loads one); afterwards it changes nothing and returns `false`.
pub fn set_xla_log_level(level: XlaLogLevel) -> bool {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.applied {
        return false;
    }
    state.requested = Some(level);
    true
}

/// Sets `TF_CPP_MIN_LOG_LEVEL` for the plugin about to be loaded, the first time it is called
/// in the process, from (first match): the level given to [`set_xla_log_level`] (which
/// overrides a `TF_CPP_MIN_LOG_LEVEL` already set); a `TF_CPP_MIN_LOG_LEVEL` the user set
/// (left as it is: nothing is written); `STABLEGRAPH_LOG` (see [`XlaLogLevel::parse`]; another
/// value is named in one line on stderr and read as `error`); else [`XlaLogLevel::Error`].
///
/// Why writing the environment is acceptable here: it is XLA's only logging interface (see the
/// module doc), and it is written once, before the first plugin is loaded, so no XLA code or
/// XLA thread exists yet to read it concurrently. Rust's own environment reads take the same
/// lock as this write. What remains unsynchronised is C code elsewhere in the process calling
/// `getenv` on another thread at the same moment (glibc's `setenv` may move the environment
/// block under it); a program with such threads can set `TF_CPP_MIN_LOG_LEVEL` itself before
/// they start, and then nothing is written here. Child processes inherit the variable.
pub(crate) fn apply_before_first_load() {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.applied {
        return;
    }
    state.applied = true;
    const TF: &str = "TF_CPP_MIN_LOG_LEVEL";
    let level = match state.requested {
        Some(level) => level,
        None if std::env::var_os(TF).is_some() => return,
        None => match std::env::var("STABLEGRAPH_LOG") {
            Err(_) => XlaLogLevel::Error,
            Ok(value) => XlaLogLevel::parse(&value).unwrap_or_else(|| {
                eprintln!(
                    "stablegraph: STABLEGRAPH_LOG={value:?} is not one of info, warning, \
                     error, off; showing XLA's errors only"
                );
                XlaLogLevel::Error
            }),
        },
    };
    std::env::set_var(TF, level.tf_cpp_min_log_level());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_parse_and_map_to_tsl_levels() {
        for (text, level, tf) in [
            ("info", XlaLogLevel::Info, "0"),
            (" Verbose ", XlaLogLevel::Info, "0"),
            ("WARN", XlaLogLevel::Warning, "1"),
            ("warning", XlaLogLevel::Warning, "1"),
            ("", XlaLogLevel::Error, "2"),
            ("error", XlaLogLevel::Error, "2"),
            ("quiet", XlaLogLevel::Off, "3"),
            ("off", XlaLogLevel::Off, "3"),
        ] {
            assert_eq!(XlaLogLevel::parse(text), Some(level), "{text:?}");
            assert_eq!(level.tf_cpp_min_log_level(), tf);
        }
        assert_eq!(XlaLogLevel::parse("loud"), None);
    }
}
