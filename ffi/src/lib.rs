//! C ABI.
