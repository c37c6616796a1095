//! Element types of collective buffers, with their wire codes (the header's
//! `dtype` byte, equal to the C ABI's `aggbox_dtype` values).

use crate::{Error, Result};

/// The type of the elements of a collective's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// `u8` (broadcast only: bytes are not reduced).
    U8 = 0,
    /// `i32`.
    I32 = 1,
    /// `i64`.
    I64 = 2,
    /// `u32`.
    U32 = 3,
    /// `u64`.
    U64 = 4,
    /// `f32` (IEEE 754 binary32).
    F32 = 5,
    /// `f64` (IEEE 754 binary64).
    F64 = 6,
}

impl Dtype {
    /// Every element type, in wire-code order.
    pub const ALL: [Dtype; 7] = [Dtype::U8, Dtype::I32, Dtype::I64, Dtype::U32, Dtype::U64, Dtype::F32, Dtype::F64];

    /// Bytes of one element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    /// The code in the header's `dtype` byte.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The element type whose wire code is `code`, if any.
    pub fn from_code(code: u8) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.code() == code)
    }

    /// The name used in messages ("u8", "f32", ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }

    /// Bytes of `count` elements, or [`Error::InvalidArgument`] when that
    /// does not fit in memory (`isize::MAX` bytes).
    pub fn bytes(self, count: usize) -> Result<usize> {
        count
            .checked_mul(self.size())
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{count} elements of {} ({} bytes each) are more bytes than any buffer holds",
                    self.name(),
                    self.size()
                ))
            })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of a [`Dtype`]: plain data for which
/// every bit pattern is a valid value, so a buffer of it may be filled with
/// bytes that came from the network.
///
/// # Safety
///
/// Implement only for types with no padding and no invalid bit patterns,
/// whose size is `DTYPE.size()`.
pub unsafe trait Element: Copy + Send + 'static {
    /// Its element type.
    const DTYPE: Dtype;
}

macro_rules! elements {
    ($($ty:ty => $dtype:ident),*) => {$(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl Element for $ty {
            const DTYPE: Dtype = Dtype::$dtype;
        }
        const _: () = assert!(std::mem::size_of::<$ty>() == Dtype::$dtype.size());
    )*};
}

elements!(u8 => U8, i32 => I32, i64 => I64, u32 => U32, u64 => U64, f32 => F32, f64 => F64);

/// The bytes of a slice of elements.
pub fn as_bytes<T: Element>(elements: &[T]) -> &[u8] {
    // SAFETY: `Element` types have no padding; the byte slice covers
    // exactly the elements' memory and borrows it.
    unsafe { std::slice::from_raw_parts(elements.as_ptr().cast::<u8>(), std::mem::size_of_val(elements)) }
}

/// The bytes of a slice of elements, for writing.
pub fn as_bytes_mut<T: Element>(elements: &mut [T]) -> &mut [u8] {
    // SAFETY: `Element` types have no padding and accept every bit pattern;
    // the byte slice covers exactly the elements' memory and borrows it.
    unsafe { std::slice::from_raw_parts_mut(elements.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(elements)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_sizes_and_names() {
        for (code, dtype) in Dtype::ALL.into_iter().enumerate() {
            assert_eq!(dtype.code() as usize, code);
            assert_eq!(Dtype::from_code(code as u8), Some(dtype));
        }
        assert_eq!(Dtype::from_code(7), None);
        assert_eq!(Dtype::F64.size(), 8);
        assert_eq!(Dtype::I32.to_string(), "i32");
        assert_eq!(Dtype::U64.bytes(3).unwrap(), 24);
        let overflow = Dtype::U64.bytes(usize::MAX / 4).unwrap_err();
        assert_eq!(overflow.status(), crate::Status::InvalidArgument);
        assert!(Dtype::U8.bytes(isize::MAX as usize + 1).is_err());
    }

    #[test]
    fn element_slices_are_their_bytes() {
        let mut values = [1.0f32, -2.0];
        let bytes = as_bytes_mut(&mut values);
        assert_eq!(bytes.len(), 8);
        bytes[..4].copy_from_slice(&3.5f32.to_le_bytes());
        assert_eq!(values, [3.5, -2.0]);
        assert_eq!(<f64 as Element>::DTYPE, Dtype::F64);
    }
}
