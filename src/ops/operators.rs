//! The operators `+ - * / %` and unary `-`, each the method of the same name ([`Tensor::add`],
//! [`Tensor::sub`], [`Tensor::mul`], [`Tensor::div`], [`Tensor::rem`], [`Tensor::neg`]), so they
//! broadcast, check dtypes and name the caller's line alike.
//!
//! Every combination gives `Result<Tensor>`: tensors by value or by reference, a
//! `Result<Tensor>` (the output of another operator) on either side of a tensor, a [`Number`]
//! on the right of a tensor, and an `f64` or `i64` on its left (one type per kind of literal, so
//! that `2 * &t` and `1.0 - &t` infer). The number takes the tensor's dtype; an integer must be a
//! value of it (`&t * 10` on `u8` is fine, `&t + 300` is an error), a float rounds to it. Rust's
//! orphan rule forbids `Result + Result` and `Result + number`; use `?` there.

use std::ops::{Add, Div, Mul, Neg, Rem, Sub};
use std::panic::Location;

use super::elementwise::{Number, Operand};
use super::tensor::Tensor;
use crate::error::Result;

/// One operator impl: `$lhs $trait $rhs` evaluates `$body` with the operands bound to `$l` and
/// `$r`.
macro_rules! operator_impl {
    ($trait:ident, $method:ident, $lhs:ty, $rhs:ty, |$l:ident, $r:ident| $body:expr) => {
        impl $trait<$rhs> for $lhs {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: $rhs) -> Result<Tensor> {
                let ($l, $r) = (self, rhs);
                $body
            }
        }
    };
}

/// Every operand combination of one binary operator.
macro_rules! operator {
    ($trait:ident, $method:ident) => {
        operator_impl!($trait, $method, Tensor, Tensor, |l, r| Tensor::$method(&l, r));
        operator_impl!($trait, $method, Tensor, &Tensor, |l, r| Tensor::$method(&l, r));
        operator_impl!($trait, $method, Tensor, Result<Tensor>, |l, r| Tensor::$method(&l, r?));
        operator_impl!($trait, $method, &Tensor, Tensor, |l, r| Tensor::$method(l, r));
        operator_impl!($trait, $method, &Tensor, &Tensor, |l, r| Tensor::$method(l, r));
        operator_impl!($trait, $method, &Tensor, Result<Tensor>, |l, r| Tensor::$method(l, r?));
        operator_impl!($trait, $method, Result<Tensor>, Tensor, |l, r| Tensor::$method(&l?, r));
        operator_impl!($trait, $method, Result<Tensor>, &Tensor, |l, r| Tensor::$method(&l?, r));
        impl<N: Number> $trait<N> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: N) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl<N: Number> $trait<N> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: N) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        operator!(@left $trait, $method; f64, i64);
    };
    (@left $trait:ident, $method:ident; $($n:ty),*) => {$(
        operator_impl!($trait, $method, $n, Tensor, |l, r| {
            let l = l.to_tensor(&r, stringify!($method), Location::caller())?;
            Tensor::$method(&l, r)
        });
        operator_impl!($trait, $method, $n, &Tensor, |l, r| {
            let l = l.to_tensor(r, stringify!($method), Location::caller())?;
            Tensor::$method(&l, r)
        });
    )*};
}

operator!(Add, add);
operator!(Sub, sub);
operator!(Mul, mul);
operator!(Div, div);
operator!(Rem, rem);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
