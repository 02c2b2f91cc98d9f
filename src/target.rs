//! Where a program will run ([`Target`]): the platform and what its processor can do, decided
//! once from the client and carried by each graph ([`crate::ops::Graph::with_target`]), so
//! that the layers choose the forms that platform runs well (the CPU forms never reach a GPU
//! program).

use crate::runtime::Client;

/// The kind of device a program runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// XLA's CPU backend.
    Cpu,
    /// A GPU (CUDA or ROCm).
    Gpu,
    /// Anything else (a TPU, say).
    Other,
}

/// Where a program will run: its platform, and whether its processor has bf16 dot instructions
/// that XLA uses (on the CPU: AVX512-BF16 or AMX-BF16; elsewhere assumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// The platform.
    pub platform: Platform,
    /// Whether a bf16 dot runs natively (faster than converting its operands to f32).
    pub bf16_dot: bool,
}

impl Target {
    /// The target of `client`'s programs: its platform as PJRT names it (`cpu`; `cuda`, `rocm`
    /// or `gpu`; anything else), and on the CPU this processor's bf16 dot.
    pub fn of(client: &Client) -> Target {
        match client.platform_name().as_deref() {
            Ok("cpu") => Target::host(),
            Ok("cuda" | "rocm" | "gpu") => Target {
                platform: Platform::Gpu,
                bf16_dot: true,
            },
            _ => Target {
                platform: Platform::Other,
                bf16_dot: true,
            },
        }
    }

    /// This host's CPU (what a graph built without a target assumes): its bf16 dot as
    /// `/proc/cpuinfo` lists its flags (read once; assumed where that file cannot say).
    pub fn host() -> Target {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let bf16_dot = *HAS.get_or_init(|| match std::fs::read_to_string("/proc/cpuinfo") {
            Ok(info) => info.lines().filter(|l| l.starts_with("flags")).any(|l| {
                l.split_whitespace()
                    .any(|f| f == "avx512_bf16" || f == "amx_bf16")
            }),
            Err(_) => true,
        });
        Target {
            platform: Platform::Cpu,
            bf16_dot,
        }
    }

    /// Whether the platform is the CPU.
    pub fn is_cpu(&self) -> bool {
        self.platform == Platform::Cpu
    }
}
