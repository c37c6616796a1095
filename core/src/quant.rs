//! Edge quantization of float sums (docs/ALLREDUCE.md, "Quantized sums").
//!
//! Ranks first agree on a scale: the max-reduce of each rank's largest
//! |x|, rounded up to a power of two `2^e`. Each rank then turns its floats
//! into integers with `B` fractional bits below that scale, `q = round(x ·
//! 2^(B − e))` (|q| ≤ 2^B), the owners add integers (in user space or in
//! the kernel, which has no floating point), and each rank turns the sums
//! back, `y = Σq · 2^(e − B)`. With B = 22 for f32 (32-bit lanes) and B = 54
//! for f64 (64-bit lanes), no sum of up to 256 ranks overflows: |Σq| ≤
//! 2^(B+8) < 2^31 resp. 2^63. Each q is off by at most 1/2, so a sum is off
//! by at most N · 2^(e − B − 1) < N · 2^−B · max|x|, plus the last rounding
//! to the float type; and the result does not depend on the order in which
//! contributions arrive.

//!
//! Float MIN and MAX travel as integers too, exactly: [`to_ordered`] maps
//! each float to an unsigned integer key that orders as the floats do
//! (negative floats have their bits inverted, the others their sign bit
//! set), so the owners, and the kernel, take unsigned MIN/MAX of the keys,
//! and [`from_ordered`] maps them back. NaN is made the extreme the op
//! picks (the largest key for MAX, the smallest for MIN), so NaN wins, and
//! −0 orders below +0.

use crate::{dtype::Dtype, op::ReduceOp};

/// Fractional bits of an f32 quantized to 32-bit lanes.
pub const F32_BITS: i32 = 22;
/// Fractional bits of an f64 quantized to 64-bit lanes.
pub const F64_BITS: i32 = 54;

/// The integer lanes that quantized elements of `dtype` travel in, and
/// their fractional bits; `None` for types that are not quantized.
pub fn lanes(dtype: Dtype) -> Option<(Dtype, i32)> {
    match dtype {
        Dtype::F32 => Some((Dtype::I32, F32_BITS)),
        Dtype::F64 => Some((Dtype::I64, F64_BITS)),
        _ => None,
    }
}

/// `x · 2^n`, exact unless the result overflows or is subnormal.
pub fn ldexp(mut x: f64, mut n: i32) -> f64 {
    const BIG: f64 = f64::from_bits(((1000 + 1023) as u64) << 52); // 2^1000
    const SMALL: f64 = f64::from_bits(((-1000 + 1023) as u64) << 52); // 2^-1000
    while n > 1000 {
        x *= BIG;
        n -= 1000;
    }
    while n < -1000 {
        x *= SMALL;
        n += 1000;
    }
    x * f64::from_bits(((n + 1023) as u64) << 52)
}

/// The largest |x| of the float elements in `bytes`: NaN if one is NaN,
/// infinity if one is infinite (and none is NaN).
pub fn max_abs(dtype: Dtype, bytes: &[u8]) -> f64 {
    let mut max = 0.0f64;
    let mut nan = false;
    match dtype {
        Dtype::F32 => {
            for b in bytes.chunks_exact(4) {
                let x = f32::from_le_bytes(b.try_into().unwrap()).abs();
                nan |= x.is_nan();
                max = max.max(x as f64);
            }
        }
        Dtype::F64 => {
            for b in bytes.chunks_exact(8) {
                let x = f64::from_le_bytes(b.try_into().unwrap()).abs();
                nan |= x.is_nan();
                max = max.max(x);
            }
        }
        _ => {}
    }
    if nan {
        f64::NAN
    } else {
        max
    }
}

/// The exponent `e` of the scale: the least power of two with `2^e ≥ max`
/// (`max` finite and positive).
pub fn scale_exponent(max: f64) -> i32 {
    debug_assert!(max.is_finite() && max > 0.0);
    let (mut m, mut shift) = (max, 0);
    if m < f64::MIN_POSITIVE {
        m = ldexp(m, 64); // subnormal: normalise first
        shift = 64;
    }
    let biased = ((m.to_bits() >> 52) & 0x7ff) as i32;
    let exact = m.to_bits() & ((1 << 52) - 1) == 0;
    // m = 1.f · 2^(biased − 1023); a power of two needs no rounding up.
    (biased - 1023 + i32::from(!exact)) - shift
}

/// Quantizes the floats `src` (elements of `dtype`) into `dst` (its lanes,
/// the same number of bytes) at scale exponent `e`.
pub fn quantize(dtype: Dtype, src: &[u8], dst: &mut [u8], e: i32) {
    match dtype {
        Dtype::F32 => {
            let factor = ldexp(1.0, F32_BITS - e);
            for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
                let x = f32::from_le_bytes(s.try_into().unwrap()) as f64;
                d.copy_from_slice(&((x * factor).round() as i32).to_le_bytes());
            }
        }
        Dtype::F64 => {
            let shift = F64_BITS - e;
            for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
                let x = f64::from_le_bytes(s.try_into().unwrap());
                d.copy_from_slice(&(ldexp(x, shift).round() as i64).to_le_bytes());
            }
        }
        _ => unreachable!("only floats are quantized"),
    }
}

/// Turns the integer sums `src` back into floats of `dtype` in `dst`, at
/// scale exponent `e`, divided by `divisor` (the ranks, for AVG; else 1).
pub fn dequantize(dtype: Dtype, src: &[u8], dst: &mut [u8], e: i32, divisor: usize) {
    match dtype {
        Dtype::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
                let q = i32::from_le_bytes(s.try_into().unwrap()) as f64;
                d.copy_from_slice(&((ldexp(q, e - F32_BITS) / divisor as f64) as f32).to_le_bytes());
            }
        }
        Dtype::F64 => {
            for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
                let q = i64::from_le_bytes(s.try_into().unwrap()) as f64;
                d.copy_from_slice(&(ldexp(q, e - F64_BITS) / divisor as f64).to_le_bytes());
            }
        }
        _ => unreachable!("only floats are quantized"),
    }
}

/// The unsigned lanes ordered keys of `dtype` travel in (`None` for
/// types that are not floats).
pub fn ordered_lanes(dtype: Dtype) -> Option<Dtype> {
    match dtype {
        Dtype::F32 => Some(Dtype::U32),
        Dtype::F64 => Some(Dtype::U64),
        _ => None,
    }
}

/// The key of the float with bits `bits` (`width` bits wide) for `op`.
fn key(bits: u64, width: u32, nan: bool, op: ReduceOp) -> u64 {
    let sign = 1u64 << (width - 1);
    let ones = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
    if nan {
        return if op == ReduceOp::Min { 0 } else { ones };
    }
    if bits & sign != 0 {
        !bits & ones
    } else {
        bits | sign
    }
}

/// The float bits of key `k` (`width` bits wide).
fn unkey(k: u64, width: u32) -> u64 {
    let sign = 1u64 << (width - 1);
    let ones = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
    if k & sign != 0 {
        k & !sign
    } else {
        !k & ones
    }
}

/// The ordered keys, for MIN or MAX `op`, of the floats of `dtype` in
/// `src`, into `dst` (the same length).
pub fn to_ordered(dtype: Dtype, op: ReduceOp, src: &[u8], dst: &mut [u8]) {
    match dtype {
        Dtype::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
                let x = f32::from_le_bytes(s.try_into().unwrap());
                d.copy_from_slice(&(key(u64::from(x.to_bits()), 32, x.is_nan(), op) as u32).to_le_bytes());
            }
        }
        Dtype::F64 => {
            for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
                let x = f64::from_le_bytes(s.try_into().unwrap());
                d.copy_from_slice(&key(x.to_bits(), 64, x.is_nan(), op).to_le_bytes());
            }
        }
        _ => unreachable!("only floats have ordered keys"),
    }
}

/// The floats of `dtype` whose ordered keys are in `src`, into `dst`.
pub fn from_ordered(dtype: Dtype, src: &[u8], dst: &mut [u8]) {
    match dtype {
        Dtype::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
                let k = u32::from_le_bytes(s.try_into().unwrap());
                d.copy_from_slice(&(unkey(u64::from(k), 32) as u32).to_le_bytes());
            }
        }
        Dtype::F64 => {
            for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
                let k = u64::from_le_bytes(s.try_into().unwrap());
                d.copy_from_slice(&unkey(k, 64).to_le_bytes());
            }
        }
        _ => unreachable!("only floats have ordered keys"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldexp_and_scale_exponents() {
        assert_eq!(ldexp(3.0, 4), 48.0);
        assert_eq!(ldexp(1.0, -1074), f64::from_bits(1));
        assert_eq!(ldexp(ldexp(1.0, 1023), -2046), ldexp(1.0, -1023));
        assert_eq!(scale_exponent(1.0), 0);
        assert_eq!(scale_exponent(1000.0), 10);
        assert_eq!(scale_exponent(1024.0), 10);
        assert_eq!(scale_exponent(0.3), -1);
        assert_eq!(scale_exponent(f64::from_bits(1)), -1074);
        for max in [1e-300, 3.7, 1e300, f64::MAX] {
            let e = scale_exponent(max);
            assert!(ldexp(1.0, e) >= max && ldexp(1.0, e - 1) < max, "{max}: {e}");
        }
    }

    #[test]
    fn quantized_sums_are_within_the_bound() {
        // Three ranks' f32 vectors; the sum of their quantized forms, turned
        // back, against a sum in f64.
        let ranks: Vec<Vec<f32>> = (0..3).map(|r| (0..100).map(|i| ((i * 37 + r * 11) % 200) as f32 * 0.731 - 70.0).collect()).collect();
        let max = ranks.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs() as f64));
        let e = scale_exponent(max);
        let mut sum = vec![0i32; 100];
        for v in &ranks {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert!(max_abs(Dtype::F32, &bytes) <= max);
            let mut q = vec![0u8; bytes.len()];
            quantize(Dtype::F32, &bytes, &mut q, e);
            for (s, c) in sum.iter_mut().zip(q.chunks_exact(4)) {
                *s = s.wrapping_add(i32::from_le_bytes(c.try_into().unwrap()));
            }
        }
        let sum_bytes: Vec<u8> = sum.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = vec![0u8; sum_bytes.len()];
        dequantize(Dtype::F32, &sum_bytes, &mut out, e, 1);
        for (i, c) in out.chunks_exact(4).enumerate() {
            let got = f32::from_le_bytes(c.try_into().unwrap()) as f64;
            let want: f64 = ranks.iter().map(|v| v[i] as f64).sum();
            assert!((got - want).abs() <= 3.0 * 2f64.powi(-F32_BITS) * max + want.abs() * 2f64.powi(-24), "{i}: {got} vs {want}");
        }
        assert!(max_abs(Dtype::F64, &f64::NAN.to_le_bytes()).is_nan());
        assert_eq!(max_abs(Dtype::F64, &f64::NEG_INFINITY.to_le_bytes()), f64::INFINITY);
    }

    #[test]
    fn ordered_keys_order_as_the_floats_and_come_back() {
        let xs = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-40, 2.0, 7.25e20, f32::INFINITY];
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut keys = vec![0u8; bytes.len()];
        to_ordered(Dtype::F32, ReduceOp::Max, &bytes, &mut keys);
        let k: Vec<u32> = keys.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        assert!(k.windows(2).all(|w| w[0] < w[1]), "{k:x?}");
        let mut back = vec![0u8; bytes.len()];
        from_ordered(Dtype::F32, &keys, &mut back);
        assert_eq!(back, bytes, "bit for bit, signed zeros included");
        // NaN is the largest key for MAX and the smallest for MIN.
        let nan = f64::NAN.to_le_bytes();
        let (mut max, mut min) = ([0u8; 8], [0u8; 8]);
        to_ordered(Dtype::F64, ReduceOp::Max, &nan, &mut max);
        to_ordered(Dtype::F64, ReduceOp::Min, &nan, &mut min);
        assert_eq!((u64::from_le_bytes(max), u64::from_le_bytes(min)), (u64::MAX, 0));
        let mut back = [0u8; 8];
        from_ordered(Dtype::F64, &max, &mut back);
        assert!(f64::from_le_bytes(back).is_nan());
        from_ordered(Dtype::F64, &min, &mut back);
        assert!(f64::from_le_bytes(back).is_nan());
    }
}
