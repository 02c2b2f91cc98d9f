//! [`ShardedBuffer`]: one global array held as blocks on several devices of a client.

use super::buffer::Buffer;
use super::client::Client;
use crate::array::HostArray;
use crate::dtype::{DType, Element, TensorType};
use crate::error::{Error, Result};
use crate::sharding::{Mesh, Sharding};

/// A global array laid out over a mesh's devices: its type, its [`Sharding`], and one device
/// [`Buffer`] per mesh position (the block [`Sharding::split`] gives that position; replicated
/// dimensions are whole on every device). An unsharded array is the one-device case
/// ([`Sharding::single`]). Sharded programs take and return these (see
/// [`crate::CompiledGraph::run_sharded`]).
#[derive(Debug)]
pub struct ShardedBuffer {
    ty: TensorType,
    sharding: Sharding,
    shards: Vec<Buffer>,
}

impl Client {
    /// An error unless every device of `mesh` is one of this client's.
    pub fn check_mesh(&self, mesh: &Mesh) -> Result<()> {
        let count = self.device_count();
        if let Some(&d) = mesh.devices().iter().find(|&&d| d >= count) {
            return Err(Error::InvalidArgument(format!(
                "the mesh places a position on device {d}, but the client has {count} \
                 addressable devices (a mesh of {} devices needs a client with at least that \
                 many; the CPU plugin takes the create option cpu_device_count)",
                mesh.size()
            )));
        }
        Ok(())
    }

    /// Uploads `array` split as `sharding` says: each device of its mesh gets its block.
    pub fn sharded_buffer_from_host_array(
        &self,
        array: &HostArray,
        sharding: &Sharding,
    ) -> Result<ShardedBuffer> {
        self.check_mesh(sharding.mesh())?;
        let blocks = sharding.split(array)?;
        let shards = blocks
            .iter()
            .zip(sharding.mesh().devices())
            .map(|(b, &d)| self.buffer_from_bytes(b.dtype(), b.dims(), &b.to_bytes(), d))
            .collect::<Result<Vec<Buffer>>>()?;
        Ok(ShardedBuffer {
            ty: array.ty(),
            sharding: sharding.clone(),
            shards,
        })
    }
}

impl ShardedBuffer {
    /// Wraps per-device blocks: `shards[i]` must be the block of mesh position `i`, on that
    /// position's device, of the block type `sharding` gives for `ty`.
    pub fn from_shards(ty: TensorType, sharding: Sharding, shards: Vec<Buffer>) -> Result<Self> {
        sharding.check(&ty, "sharded buffer")?;
        let block = sharding.shard_dims(&ty.dims);
        if shards.len() != sharding.mesh().size() {
            return Err(Error::InvalidArgument(format!(
                "a sharded buffer over a mesh of {} devices needs as many shards, got {}",
                sharding.mesh().size(),
                shards.len()
            )));
        }
        for (i, (s, &d)) in shards.iter().zip(sharding.mesh().devices()).enumerate() {
            if s.dtype() != ty.dtype || s.dims() != block.as_slice() || s.device() != d {
                return Err(Error::InvalidArgument(format!(
                    "shard {i} is {s:?} on device {}, expected {}{block:?} on device {d}",
                    s.device(),
                    ty.dtype
                )));
            }
        }
        Ok(ShardedBuffer {
            ty,
            sharding,
            shards,
        })
    }

    /// A one-device buffer as an unsharded array (device 0 only: [`Sharding::single`]).
    pub fn from_buffer(buffer: Buffer) -> Result<Self> {
        let ty = TensorType::new(buffer.dtype(), buffer.dims());
        ShardedBuffer::from_shards(ty, Sharding::single(), vec![buffer])
    }

    /// The global type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The global shape.
    pub fn dims(&self) -> &[usize] {
        &self.ty.dims
    }

    /// The layout.
    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The per-device blocks, in mesh order.
    pub fn shards(&self) -> &[Buffer] {
        &self.shards
    }

    /// The blocks, giving up the wrapper.
    pub fn into_shards(self) -> Vec<Buffer> {
        self.shards
    }

    /// Whether an execution took over any block (see [`Buffer::is_donated`]).
    pub fn is_donated(&self) -> bool {
        self.shards.iter().any(Buffer::is_donated)
    }

    /// The bytes each device holds for this array.
    pub fn bytes_per_device(&self) -> usize {
        self.shards
            .first()
            .map_or(0, |s| s.element_count() * s.dtype().size_in_bytes())
    }

    /// Downloads the global array as a row-major `Vec`; `T` must match [`ShardedBuffer::dtype`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.ty.dtype {
            return Err(Error::InvalidArgument(format!(
                "cannot read a {} array as {}",
                self.ty,
                T::DTYPE
            )));
        }
        Ok(T::from_bytes(&self.to_host_array()?.to_bytes()))
    }

    /// Downloads every block and joins them into the global array.
    pub fn to_host_array(&self) -> Result<HostArray> {
        if let [only] = self.shards.as_slice() {
            return only.to_host_array();
        }
        let blocks = self
            .shards
            .iter()
            .map(Buffer::to_host_array)
            .collect::<Result<Vec<_>>>()?;
        self.sharding.assemble(&self.ty, &blocks)
    }
}
