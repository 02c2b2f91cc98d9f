//! A fake PJRT plugin for tests: a function table in memory whose functions hand out numbered
//! handles and record every create and destroy, so that tests can check the order in which the
//! runtime destroys what a client made, without a real plugin.
//!
//! Handles are plain numbers cast to pointers; the runtime never dereferences a PJRT handle, only
//! passes it back to the plugin, and these functions look it up in a registry. A destroy of an
//! object whose client is already destroyed, a double destroy and a use of an unknown handle are
//! recorded as violations.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::ffi::{self, PJRT_Api, PJRT_Error};
use super::plugin::{named_values, Plugin, Value};

/// What a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Client,
    LoadedExecutable,
    Executable,
    Buffer,
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Create {
        kind: Kind,
        id: usize,
        client: usize,
    },
    Destroy {
        kind: Kind,
        id: usize,
        client: usize,
    },
    /// Something the plugin would not survive, described.
    Violation(String),
}

struct Registry {
    /// Live handles: kind and owning client.
    live: HashMap<usize, (Kind, usize)>,
    /// Every event, in order.
    log: Vec<Record>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            Mutex::new(Registry {
                live: HashMap::new(),
                log: Vec::new(),
            })
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A fresh handle value: a multiple of 16, never 0.
fn next_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) << 4
}

fn create(kind: Kind, client: Option<usize>) -> usize {
    let id = next_id();
    let client = client.unwrap_or(id);
    let mut r = registry();
    r.live.insert(id, (kind, client));
    r.log.push(Record::Create { kind, id, client });
    id
}

/// The owning client of a live handle of `kind`, recording a violation for anything else.
fn owner(kind: Kind, id: usize, what: &str) -> Option<usize> {
    let mut r = registry();
    match r.live.get(&id).copied() {
        Some((k, client)) if k == kind => {
            if kind != Kind::Client && !r.live.contains_key(&client) {
                r.log.push(Record::Violation(format!(
                    "{what} used {kind:?} {id} after its client {client} was destroyed"
                )));
            }
            Some(client)
        }
        _ => {
            r.log.push(Record::Violation(format!(
                "{what} got {id}, which is not a live {kind:?}"
            )));
            None
        }
    }
}

fn destroy(kind: Kind, id: usize, what: &str) {
    let Some(client) = owner(kind, id, what) else {
        return;
    };
    let mut r = registry();
    if kind == Kind::Client {
        let orphans: Vec<String> = r
            .live
            .iter()
            .filter(|&(&h, &(_, c))| c == id && h != id)
            .map(|(h, (k, _))| format!("{k:?} {h}"))
            .collect();
        if !orphans.is_empty() {
            r.log.push(Record::Violation(format!(
                "client {id} destroyed while it still owns {}",
                orphans.join(", ")
            )));
        }
    }
    r.live.remove(&id);
    r.log.push(Record::Destroy { kind, id, client });
}

/// Every event that concerns `client` (its own and its objects'), and every violation naming it.
pub(crate) fn records_of(client: usize) -> Vec<Record> {
    let needle = format!(" {client}");
    registry()
        .log
        .iter()
        .filter(|e| match e {
            Record::Create { client: c, .. } | Record::Destroy { client: c, .. } => *c == client,
            Record::Violation(m) => m.contains(&needle),
        })
        .cloned()
        .collect()
}

fn ptr<T>(id: usize) -> *mut T {
    id as *mut T
}

fn id<T>(p: *const T) -> usize {
    p as usize
}

/// Reads the argument struct a fake function was given.
///
/// # Safety
/// `args` must point to a live `T`.
unsafe fn args<'a, T>(args: *mut c_void) -> &'a mut T {
    // SAFETY: the caller passes the argument struct of the slot this function fills.
    unsafe { &mut *args.cast::<T>() }
}

type Ret = *mut PJRT_Error;
const OK: Ret = std::ptr::null_mut();

/// A device list that lives forever: one device.
static DEVICES: [usize; 1] = [0x1000];
/// Every program of this plugin returns one f32[2].
static OUTPUT_TYPES: [i32; 1] = [11];
static OUTPUT_RANKS: [usize; 1] = [1];
static OUTPUT_DIMS: [i64; 1] = [2];

/// Named values as the plugin reads them.
type Named = Vec<(String, Value)>;

/// The create options each client was given, by client handle.
static CREATE_OPTIONS: Mutex<Option<HashMap<usize, Named>>> = Mutex::new(None);

/// The create options the client with handle `client` was created with, as the plugin read them.
pub(crate) fn create_options_of(client: usize) -> Named {
    let options = CREATE_OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    options
        .as_ref()
        .and_then(|o| o.get(&client).cloned())
        .unwrap_or_default()
}

unsafe extern "C" fn client_create(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Client_Create_Args>(a) };
    // SAFETY: the runtime passes `num_options` values valid for the call.
    let options = unsafe { named_values(a.create_options, a.num_options) };
    let client = create(Kind::Client, None);
    CREATE_OPTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(client, options);
    a.client = ptr(client);
    OK
}

unsafe extern "C" fn client_destroy(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Client_Destroy_Args>(a) };
    destroy(Kind::Client, id(a.client), "PJRT_Client_Destroy");
    OK
}

unsafe extern "C" fn client_devices(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Client_AddressableDevices_Args>(a) };
    owner(Kind::Client, id(a.client), "PJRT_Client_AddressableDevices");
    a.addressable_devices = DEVICES.as_ptr().cast();
    a.num_addressable_devices = DEVICES.len();
    OK
}

unsafe extern "C" fn client_compile(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Client_Compile_Args>(a) };
    let client = owner(Kind::Client, id(a.client), "PJRT_Client_Compile");
    a.executable = ptr(create(Kind::LoadedExecutable, client));
    OK
}

unsafe extern "C" fn loaded_destroy(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_LoadedExecutable_Destroy_Args>(a) };
    destroy(
        Kind::LoadedExecutable,
        id(a.executable),
        "PJRT_LoadedExecutable_Destroy",
    );
    OK
}

unsafe extern "C" fn get_executable(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_LoadedExecutable_GetExecutable_Args>(a) };
    let client = owner(
        Kind::LoadedExecutable,
        id(a.loaded_executable),
        "PJRT_LoadedExecutable_GetExecutable",
    );
    a.executable = ptr(create(Kind::Executable, client));
    OK
}

unsafe extern "C" fn executable_destroy(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Executable_Destroy_Args>(a) };
    destroy(
        Kind::Executable,
        id(a.executable),
        "PJRT_Executable_Destroy",
    );
    OK
}

unsafe extern "C" fn num_outputs(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Executable_NumOutputs_Args>(a) };
    owner(Kind::Executable, id(a.executable), "NumOutputs");
    a.num_outputs = OUTPUT_TYPES.len();
    OK
}

unsafe extern "C" fn output_types(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Executable_OutputElementTypes_Args>(a) };
    owner(Kind::Executable, id(a.executable), "OutputElementTypes");
    a.output_types = OUTPUT_TYPES.as_ptr().cast_mut();
    a.num_output_types = OUTPUT_TYPES.len();
    OK
}

unsafe extern "C" fn output_dims(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Executable_OutputDimensions_Args>(a) };
    owner(Kind::Executable, id(a.executable), "OutputDimensions");
    a.num_outputs = OUTPUT_RANKS.len();
    a.dim_sizes = OUTPUT_RANKS.as_ptr();
    a.dims = OUTPUT_DIMS.as_ptr();
    OK
}

unsafe extern "C" fn buffer_from_host(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Client_BufferFromHostBuffer_Args>(a) };
    let client = owner(Kind::Client, id(a.client), "BufferFromHostBuffer");
    a.buffer = ptr(create(Kind::Buffer, client));
    a.done_with_host_buffer = std::ptr::null_mut();
    OK
}

unsafe extern "C" fn buffer_destroy(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Buffer_Destroy_Args>(a) };
    destroy(Kind::Buffer, id(a.buffer), "PJRT_Buffer_Destroy");
    OK
}

unsafe extern "C" fn buffer_type(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Buffer_ElementType_Args>(a) };
    owner(Kind::Buffer, id(a.buffer), "PJRT_Buffer_ElementType");
    a.type_ = OUTPUT_TYPES[0];
    OK
}

unsafe extern "C" fn buffer_dims(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_Buffer_Dimensions_Args>(a) };
    owner(Kind::Buffer, id(a.buffer), "PJRT_Buffer_Dimensions");
    a.dims = OUTPUT_DIMS.as_ptr();
    a.num_dims = OUTPUT_DIMS.len();
    OK
}

unsafe extern "C" fn execute(a: *mut c_void) -> Ret {
    // SAFETY: this slot's argument struct.
    let a = unsafe { args::<ffi::PJRT_LoadedExecutable_Execute_Args>(a) };
    let client = owner(
        Kind::LoadedExecutable,
        id(a.executable),
        "PJRT_LoadedExecutable_Execute",
    );
    // SAFETY: one device: one output list with room for every output (one), and one event.
    unsafe {
        let outputs = *a.output_lists;
        *outputs = ptr(create(Kind::Buffer, client));
        if !a.device_complete_events.is_null() {
            *a.device_complete_events = std::ptr::null_mut();
        }
    }
    OK
}

/// The fake table: every slot above, the rest null (unsupported).
fn table() -> &'static PJRT_Api {
    static TABLE: OnceLock<usize> = OnceLock::new();
    let addr = *TABLE.get_or_init(|| {
        // SAFETY: all-zero is valid for the table (integers, null pointers, `None` slots).
        let mut t: Box<PJRT_Api> = Box::new(unsafe { std::mem::zeroed() });
        t.struct_size = std::mem::size_of::<PJRT_Api>();
        t.pjrt_api_version.minor_version = 81;
        t.PJRT_Client_Create = Some(client_create);
        t.PJRT_Client_Destroy = Some(client_destroy);
        t.PJRT_Client_AddressableDevices = Some(client_devices);
        t.PJRT_Client_Compile = Some(client_compile);
        t.PJRT_Client_BufferFromHostBuffer = Some(buffer_from_host);
        t.PJRT_LoadedExecutable_Destroy = Some(loaded_destroy);
        t.PJRT_LoadedExecutable_GetExecutable = Some(get_executable);
        t.PJRT_LoadedExecutable_Execute = Some(execute);
        t.PJRT_Executable_Destroy = Some(executable_destroy);
        t.PJRT_Executable_NumOutputs = Some(num_outputs);
        t.PJRT_Executable_OutputElementTypes = Some(output_types);
        t.PJRT_Executable_OutputDimensions = Some(output_dims);
        t.PJRT_Buffer_Destroy = Some(buffer_destroy);
        t.PJRT_Buffer_ElementType = Some(buffer_type);
        t.PJRT_Buffer_Dimensions = Some(buffer_dims);
        Box::leak(t) as *const PJRT_Api as usize
    });
    // SAFETY: leaked above, so it lives for the rest of the process and is never written again.
    unsafe { &*(addr as *const PJRT_Api) }
}

/// The fake plugin.
pub(crate) fn plugin() -> Plugin {
    // SAFETY: the table lives for the rest of the process.
    unsafe { Plugin::from_table(table(), "fake-pjrt-plugin") }.expect("the fake table is valid")
}

mod destroy_order {
    //! Every object a client makes is destroyed before the client, whatever order a user drops
    //! them in and on whichever thread.

    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::ops::Graph;
    use crate::runtime::{Client, CompileCache};
    use crate::DType;

    const MLIR: &str = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  \
                        return %a : tensor<2xf32>\n}\n";

    /// What a user can hold: a client or something it made.
    type Held = Box<dyn std::any::Any + Send>;

    /// A client of the fake plugin, an executable, a compiled graph, an uploaded buffer and an
    /// output buffer; and the client's handle.
    fn make(cache: &CompileCache) -> (usize, Vec<Held>) {
        let client = Client::new(&plugin(), &[]).unwrap();
        client.set_compile_cache(cache.clone());
        let handle = client_handle(&client);
        let exe = client.compile(MLIR).unwrap();
        let g = Graph::new();
        let x = g.parameter("x", DType::F32, &[2]).unwrap();
        let y = x.add(&x).unwrap();
        g.set_outputs(&[&y]).unwrap();
        let graph = g.compile(&client).unwrap();
        let input = client.buffer_from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let mut outputs = exe.execute(&[&input]).unwrap();
        let output = outputs.pop().unwrap();
        let held: Vec<Held> = vec![
            Box::new(client),
            Box::new(exe),
            Box::new(graph),
            Box::new(input),
            Box::new(output),
        ];
        (handle, held)
    }

    fn client_handle(client: &Client) -> usize {
        client.raw() as usize
    }

    /// The client's records hold no violation, each object is created and destroyed once, and the
    /// client is destroyed last.
    fn check(client: usize, case: &str) {
        let records = records_of(client);
        let violations: Vec<&Record> = records
            .iter()
            .filter(|r| matches!(r, Record::Violation(_)))
            .collect();
        assert!(violations.is_empty(), "{case}: {violations:?}");
        let created: Vec<usize> = records
            .iter()
            .filter_map(|r| match r {
                Record::Create { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let destroyed: Vec<usize> = records
            .iter()
            .filter_map(|r| match r {
                Record::Destroy { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let mut c = created.clone();
        let mut d = destroyed.clone();
        c.sort_unstable();
        d.sort_unstable();
        assert_eq!(c, d, "{case}: created and destroyed differ: {records:?}");
        assert_eq!(
            records.last(),
            Some(&Record::Destroy {
                kind: Kind::Client,
                id: client,
                client
            }),
            "{case}: the client is not destroyed last: {records:?}"
        );
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, n - 1);
                out.push(q);
            }
        }
        out
    }

    fn caches() -> [CompileCache; 2] {
        [CompileCache::disabled(), CompileCache::memory_only()]
    }

    #[test]
    fn every_drop_order_destroys_the_client_last() {
        for cache in caches() {
            for order in permutations(5) {
                let (client, held) = make(&cache);
                let mut slots: Vec<Option<Held>> = held.into_iter().map(Some).collect();
                for &i in &order {
                    drop(slots[i].take());
                }
                check(client, &format!("{cache:?}, drop order {order:?}"));
            }
        }
    }

    #[test]
    fn drops_racing_on_threads_destroy_the_client_last() {
        for cache in caches() {
            for round in 0..25 {
                let (client, held) = make(&cache);
                let barrier = Arc::new(Barrier::new(held.len()));
                let threads: Vec<_> = held
                    .into_iter()
                    .map(|h| {
                        let barrier = barrier.clone();
                        std::thread::spawn(move || {
                            barrier.wait();
                            drop(h);
                        })
                    })
                    .collect();
                for t in threads {
                    t.join().unwrap();
                }
                check(client, &format!("{cache:?}, threads, round {round}"));
            }
        }
    }

    #[test]
    fn a_buffer_outliving_everything_else_keeps_the_client() {
        let (client, mut held) = make(&CompileCache::memory_only());
        let last = held.pop();
        drop(held);
        assert!(
            !records_of(client).contains(&Record::Destroy {
                kind: Kind::Client,
                id: client,
                client
            }),
            "the client was destroyed while a buffer lives"
        );
        drop(last);
        check(client, "buffer last");
    }
}
