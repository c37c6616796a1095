//! Reduction operators and the element-wise arithmetic of the user datapath:
//! folding one contribution into an accumulator, and the last step of AVG.
//!
//! The semantics every datapath must give (docs/ALLREDUCE.md):
//! - integer SUM wraps (two's complement), like `wrapping_add`;
//! - MIN and MAX of floats propagate NaN (IEEE 754-2019 `minimum` /
//!   `maximum`): one NaN contribution makes the result NaN; otherwise
//!   −0.0 < +0.0 is not distinguished (either may be returned);
//! - float SUM and AVG are IEEE additions in arrival order, so Inf, −Inf and
//!   NaN inputs give the IEEE result (Inf + −Inf = NaN);
//! - AVG is for float types only: SUM, then division by the number of ranks.

use crate::{dtype::Dtype, Error, Result};

/// A reduction operator (the header's `op` low nibble, equal to the C ABI's
/// `aggbox_op` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum = 0,
    /// Minimum (NaN wins for floats).
    Min = 1,
    /// Maximum (NaN wins for floats).
    Max = 2,
    /// Mean over the ranks (float types only).
    Avg = 3,
}

impl ReduceOp {
    /// Every operator, in wire-code order.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// Its wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The operator whose wire code is `code`, if any.
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.code() == code)
    }

    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Checks that this operator applies to elements of `dtype`.
    pub fn check(self, dtype: Dtype) -> Result<()> {
        match (self, dtype) {
            (_, Dtype::U8) => Err(Error::InvalidArgument(
                "u8 is for broadcast; reductions take i32, i64, u32, u64, f32 or f64".into(),
            )),
            (ReduceOp::Avg, Dtype::F32 | Dtype::F64) => Ok(()),
            (ReduceOp::Avg, other) => {
                Err(Error::InvalidArgument(format!("avg is for f32 and f64; {other} elements take sum, min or max")))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The element-wise operations on one primitive type.
trait Arith: Copy {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn sum(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
}

macro_rules! int_arith {
    ($($ty:ty),*) => {$(
        impl Arith for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn load(bytes: &[u8]) -> Self {
                <$ty>::from_le_bytes(bytes.try_into().unwrap())
            }
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes());
            }
            fn sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
        }
    )*};
}

macro_rules! float_arith {
    ($($ty:ty),*) => {$(
        impl Arith for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn load(bytes: &[u8]) -> Self {
                <$ty>::from_le_bytes(bytes.try_into().unwrap())
            }
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes());
            }
            fn sum(self, other: Self) -> Self {
                self + other
            }
            fn min(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$ty>::NAN } else if other < self { other } else { self }
            }
            fn max(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$ty>::NAN } else if other > self { other } else { self }
            }
        }
    )*};
}

int_arith!(i32, i64, u32, u64);
float_arith!(f32, f64);

fn fold_as<T: Arith>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    let f: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Avg => T::sum,
        ReduceOp::Min => T::min,
        ReduceOp::Max => T::max,
    };
    for (a, b) in acc.chunks_exact_mut(T::SIZE).zip(x.chunks_exact(T::SIZE)) {
        f(T::load(a), T::load(b)).store(a);
    }
}

/// Folds the elements `x` into the accumulator `acc` (same length, whole
/// elements of `dtype`): `acc[i] = op(acc[i], x[i])`. AVG folds as SUM (see
/// [`finish`]). `dtype` is not U8 and `op` applies to it
/// ([`ReduceOp::check`]).
pub fn fold(dtype: Dtype, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    debug_assert_eq!(acc.len(), x.len());
    match dtype {
        Dtype::I32 => fold_as::<i32>(op, acc, x),
        Dtype::I64 => fold_as::<i64>(op, acc, x),
        Dtype::U32 => fold_as::<u32>(op, acc, x),
        Dtype::U64 => fold_as::<u64>(op, acc, x),
        Dtype::F32 => fold_as::<f32>(op, acc, x),
        Dtype::F64 => fold_as::<f64>(op, acc, x),
        Dtype::U8 => unreachable!("u8 is refused by ReduceOp::check"),
    }
}

/// The last step of a reduction over `ranks` ranks: AVG divides the sums
/// by `ranks`; other operators leave `acc` as it is.
pub fn finish(dtype: Dtype, op: ReduceOp, acc: &mut [u8], ranks: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    match dtype {
        Dtype::F32 => {
            for a in acc.chunks_exact_mut(4) {
                (f32::load(a) / ranks as f32).store(a);
            }
        }
        Dtype::F64 => {
            for a in acc.chunks_exact_mut(8) {
                (f64::load(a) / ranks as f64).store(a);
            }
        }
        _ => unreachable!("avg is refused for integers by ReduceOp::check"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Arith>(values: &[T]) -> Vec<u8> {
        let mut out = vec![0; values.len() * T::SIZE];
        for (v, b) in values.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            v.store(b);
        }
        out
    }

    fn values_of<T: Arith>(bytes: &[u8]) -> Vec<T> {
        bytes.chunks_exact(T::SIZE).map(T::load).collect()
    }

    #[test]
    fn integers_wrap_and_order() {
        let mut acc = bytes_of(&[i32::MAX, -5, 7]);
        fold(Dtype::I32, ReduceOp::Sum, &mut acc, &bytes_of(&[1i32, 5, -10]));
        assert_eq!(values_of::<i32>(&acc), vec![i32::MIN, 0, -3]);
        let mut acc = bytes_of(&[u64::MAX, 3]);
        fold(Dtype::U64, ReduceOp::Sum, &mut acc, &bytes_of(&[2u64, 4]));
        assert_eq!(values_of::<u64>(&acc), vec![1, 7]);
        let mut acc = bytes_of(&[3u32, 9]);
        fold(Dtype::U32, ReduceOp::Min, &mut acc, &bytes_of(&[5u32, 1]));
        assert_eq!(values_of::<u32>(&acc), vec![3, 1]);
        let mut acc = bytes_of(&[-3i64, 9]);
        fold(Dtype::I64, ReduceOp::Max, &mut acc, &bytes_of(&[-5i64, 10]));
        assert_eq!(values_of::<i64>(&acc), vec![-3, 10]);
    }

    #[test]
    fn floats_follow_ieee_and_nan_wins_min_and_max() {
        let mut acc = bytes_of(&[f32::INFINITY, 1.5, f32::NAN, 2.0]);
        fold(Dtype::F32, ReduceOp::Sum, &mut acc, &bytes_of(&[f32::NEG_INFINITY, 2.25, 1.0, f32::INFINITY]));
        let got = values_of::<f32>(&acc);
        assert!(got[0].is_nan() && got[2].is_nan());
        assert_eq!((got[1], got[3]), (3.75, f32::INFINITY));
        for op in [ReduceOp::Min, ReduceOp::Max] {
            let mut acc = bytes_of(&[1.0f64, f64::NAN, -2.0]);
            fold(Dtype::F64, op, &mut acc, &bytes_of(&[f64::NAN, 3.0, f64::NEG_INFINITY]));
            let got = values_of::<f64>(&acc);
            assert!(got[0].is_nan() && got[1].is_nan(), "{op}: {got:?}");
            assert_eq!(got[2], if op == ReduceOp::Min { f64::NEG_INFINITY } else { -2.0 });
        }
        let mut acc = bytes_of(&[6.0f32, -3.0]);
        finish(Dtype::F32, ReduceOp::Avg, &mut acc, 3);
        assert_eq!(values_of::<f32>(&acc), vec![2.0, -1.0]);
    }

    #[test]
    fn operators_are_checked_against_types() {
        assert!(ReduceOp::Avg.check(Dtype::I32).is_err());
        assert!(ReduceOp::Sum.check(Dtype::U8).is_err());
        assert!(ReduceOp::Avg.check(Dtype::F64).is_ok());
        assert_eq!(ReduceOp::from_code(2), Some(ReduceOp::Max));
        assert_eq!(ReduceOp::from_code(4), None);
    }
}
