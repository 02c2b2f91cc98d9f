//! JAX's recorded results (`tests/fixtures/jax/`, made by the scripts there): one section of a
//! fixture file, its fields as f64 values or host arrays.

use serde_json::Value;
use stablegraph::HostArray;

/// One section of a JAX fixture file.
pub struct JaxFixture(pub Value);

impl JaxFixture {
    /// Section `section` of `tests/fixtures/jax/{file}`.
    pub fn load(file: &str, section: &str) -> JaxFixture {
        let text = std::fs::read_to_string(format!("tests/fixtures/jax/{file}")).unwrap();
        let all: Value = serde_json::from_str(&text).unwrap();
        JaxFixture(all[section].clone())
    }

    /// Field `key`'s values.
    pub fn values(&self, key: &str) -> Vec<f64> {
        self.0[key]
            .as_array()
            .unwrap_or_else(|| panic!("the fixture has no field {key}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    }

    /// Field `key` as an f64 array of `dims`.
    pub fn array(&self, key: &str, dims: &[usize]) -> HostArray {
        HostArray::from_vec(dims, self.values(key)).unwrap()
    }
}
