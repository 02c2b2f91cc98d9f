//! Parameter trees: the derive (nested structs, `Option`s, `Vec`s, renamed and skipped fields,
//! tuple structs, newtypes, enums), the provided walks (paths, unflatten, rebuild, zip) and their
//! errors, the std trees (tuples, maps), and safetensors files by path. `jit.rs` runs trees
//! through compiled programs, `nn.rs` the layers and the optimizer over trees.

#[path = "../common/mod.rs"]
mod common;
mod jit;
mod nn;

use std::collections::BTreeMap;

use common::TempDir;
use stablegraph::tree::{self, Tree};
use stablegraph::{DType, HostArray, TensorType};

#[derive(Tree, Debug, Clone, PartialEq)]
struct Layer<T> {
    norm: T,
    #[tree(rename = "mixer.in_proj")]
    in_proj: T,
    bias: Option<T>,
    #[tree(skip)]
    eps: f64,
}

#[derive(Tree, Debug, Clone, PartialEq)]
struct Model<T> {
    embedding: T,
    layers: Vec<Layer<T>>,
    extra: Vec<Option<T>>,
    head: Option<Layer<T>>,
}

#[derive(Tree, Debug, PartialEq)]
struct Pair<T>(T, Layer<T>);

#[derive(Tree, Debug, PartialEq)]
struct Wrapped<T>(Layer<T>);

#[derive(Tree, Debug, PartialEq)]
enum Block<T> {
    Dense { weight: T },
    Mixer(Layer<T>),
    Empty,
}

fn ty(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn layer(n: usize, bias: bool) -> Layer<TensorType> {
    Layer {
        norm: ty(&[n]),
        in_proj: ty(&[2 * n, n]),
        bias: bias.then(|| ty(&[2 * n])),
        eps: 1e-5,
    }
}

fn model() -> Model<TensorType> {
    Model {
        embedding: ty(&[10, 4]),
        layers: vec![layer(4, false), layer(4, true)],
        extra: vec![None, Some(ty(&[1]))],
        head: Some(layer(2, false)),
    }
}

#[test]
fn derived_paths_follow_declaration_order_renames_and_presence() {
    assert_eq!(
        model().paths(),
        [
            "embedding",
            "layers.0.norm",
            "layers.0.mixer.in_proj",
            "layers.1.norm",
            "layers.1.mixer.in_proj",
            "layers.1.bias",
            "extra.1",
            "head.norm",
            "head.mixer.in_proj",
        ]
    );
    assert_eq!(model().leaf_count(), 9);
    let pair = Pair(ty(&[1]), layer(3, true));
    assert_eq!(pair.paths(), ["0", "1.norm", "1.mixer.in_proj", "1.bias"]);
    // A newtype adds no name; an enum walks the variant it holds.
    assert_eq!(Wrapped(layer(3, false)).paths(), ["norm", "mixer.in_proj"]);
    assert_eq!(Block::Dense { weight: ty(&[2]) }.paths(), ["weight"]);
    assert_eq!(
        Block::Mixer(layer(1, true)).paths(),
        ["norm", "mixer.in_proj", "bias"]
    );
    assert!(Block::<TensorType>::Empty.paths().is_empty());
}

#[test]
fn maps_keep_the_structure_and_the_skipped_fields() {
    let types = model();
    let zeros: Model<HostArray> = types.try_map(|_, t| Ok(HostArray::zeros(t))).unwrap();
    assert_eq!(zeros.layers[1].eps, 1e-5);
    let back = zeros.try_map(|_, a| Ok(a.ty())).unwrap();
    assert_eq!(back, types);
    // By value, and to the same type.
    let numbered = types
        .clone()
        .try_into_map(|p, _| Ok(p.to_string()))
        .unwrap();
    assert_eq!(numbered.layers[1].bias.as_deref(), Some("layers.1.bias"));
    let wider = types
        .try_replace(|_, t| Ok(TensorType::new(DType::F64, &t.dims)))
        .unwrap();
    assert!(wider.leaves().iter().all(|t| t.dtype == DType::F64));
    assert_eq!(wider.layers[0].eps, 1e-5);
    // An error from the function stops the walk and comes back as it is.
    let err = types
        .try_map(|p, _| -> stablegraph::Result<()> {
            Err(stablegraph::Error::InvalidArgument(format!("stop at {p}")))
        })
        .unwrap_err();
    assert!(err.to_string().contains("stop at embedding"), "{err}");
}

#[test]
fn unflatten_and_rebuild_take_exactly_the_leaf_count() {
    let types = model();
    let ids = types.unflatten(0..9).unwrap();
    assert_eq!(ids.flatten(), (0..9).collect::<Vec<_>>());
    assert_eq!(ids.head.as_ref().unwrap().in_proj, 8);
    let few = types.unflatten(0..5).unwrap_err().to_string();
    assert!(few.contains("ran out at `layers.1.bias`"), "{few}");
    let many = types.unflatten(0..11).unwrap_err().to_string();
    assert!(many.contains("11 leaves given, the tree has 9"), "{many}");
    let leaves = types.flatten();
    assert_eq!(types.rebuild(leaves.clone()).unwrap(), types);
    assert!(types.rebuild(leaves[..8].to_vec()).is_err());
}

#[test]
fn zip_pairs_leaves_by_path_and_names_the_first_difference() {
    let a = model();
    let b = a.try_map(|_, t| Ok(t.element_count())).unwrap();
    let sums = a
        .try_zip_map(&b, |_, t, n| Ok(t.dims.iter().sum::<usize>() + n))
        .unwrap();
    assert_eq!(sums.embedding, 14 + 40);
    let mut other = model();
    other.layers[1].bias = None;
    let err = a.try_zip_map(&other, |_, _, _| Ok(())).unwrap_err();
    assert!(
        err.to_string()
            .contains("`layers.1.bias` where the other has `extra.1`"),
        "{err}"
    );
    let err = other.try_zip_map(&a, |_, _, _| Ok(())).unwrap_err();
    assert!(
        err.to_string()
            .contains("`extra.1` where the other has `layers.1.bias`"),
        "{err}"
    );
}

#[test]
fn tuples_maps_and_bare_leaves_are_trees() {
    let mut map = BTreeMap::new();
    map.insert("b".to_string(), layer(1, false));
    map.insert("a".to_string(), layer(2, true));
    let t = (ty(&[3]), map, vec![ty(&[1]), ty(&[2])]);
    assert_eq!(
        t.paths(),
        [
            "0",
            "1.a.norm",
            "1.a.mixer.in_proj",
            "1.a.bias",
            "1.b.norm",
            "1.b.mixer.in_proj",
            "2.0",
            "2.1"
        ]
    );
    assert_eq!(ty(&[2]).paths(), [""]);
    let refs = t.as_refs().unwrap();
    assert!(std::ptr::eq(refs.0, &t.0));
}

/// Host arrays of several dtypes, written and read back by path.
#[test]
fn safetensors_round_trip_by_path() {
    let dir = TempDir::new("tree-safetensors");
    let path = dir.join("model.safetensors");
    let arrays: Model<HostArray> = model()
        .unflatten((0..9).map(|i| {
            let t = &model().flatten()[i];
            let values: Vec<f32> = (0..t.element_count())
                .map(|k| (i * 100 + k) as f32)
                .collect();
            HostArray::from_vec(&t.dims, values).unwrap()
        }))
        .unwrap();
    let mut arrays = arrays;
    arrays.extra[1] = Some(HostArray::from_vec(&[1], vec![7i32]).unwrap());
    arrays.embedding = common::array_of(DType::BF16, &[10, 4], &arrays.embedding.to_f64_vec());
    tree::save_safetensors(&arrays, &path).unwrap();
    let template = arrays.try_map(|_, a| Ok(a.ty())).unwrap();
    let loaded = tree::load_safetensors(&template, &path).unwrap();
    for ((p, a), (_, b)) in arrays.named().into_iter().zip(loaded.named()) {
        assert_eq!(a.ty(), b.ty(), "{p}");
        assert_eq!(a.to_bytes(), b.to_bytes(), "{p}");
    }
    // A template that expects other shapes, lacks a tensor or has one more: each named.
    let mut other = template.clone();
    other.layers[0].norm = ty(&[5]);
    other.layers[1].bias = None;
    other.head.as_mut().unwrap().bias = Some(ty(&[4]));
    let err = tree::load_safetensors(&other, &path)
        .unwrap_err()
        .to_string();
    for want in [
        "layers.0.norm is F32 [4], expected",
        "head.bias is missing",
        "layers.1.bias has no leaf in the tree",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let missing = tree::load_safetensors(&other, &dir.join("none.safetensors"));
    assert!(missing
        .unwrap_err()
        .to_string()
        .contains("none.safetensors"));
}

#[test]
fn saving_refuses_repeated_names() {
    let dir = TempDir::new("tree-repeated");
    let a = HostArray::from_vec(&[1], vec![1f32]).unwrap();
    let mut map = BTreeMap::new();
    map.insert("x".to_string(), a.clone());
    let repeated = (map.clone(), map);
    // `0.x` and `1.x` differ; a bare leaf at the root has no name at all.
    tree::save_safetensors(&repeated, &dir.join("ok.safetensors")).unwrap();
    let err = tree::save_safetensors(&a, &dir.join("bad.safetensors")).unwrap_err();
    assert!(err.to_string().contains("empty or repeated"), "{err}");
    assert!(!dir.join("bad.safetensors").exists());
}
