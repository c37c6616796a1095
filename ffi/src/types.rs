//! The C enums: status codes, datapaths, element types and reduction ops.
//!
//! Each is a `#[repr(C)]` Rust enum, so that the header gets a real C enum
//! (`typedef enum aggbox_status {...} aggbox_status;`). The library returns
//! these types, but never takes one from C as the Rust enum: a C caller can
//! put any `int` into an enum variable, and an out-of-range Rust enum is
//! undefined behaviour. Parameters and struct fields C writes are declared
//! with the `Raw*` integer aliases below instead, which `ffi/cbindgen.toml`
//! renames to the enum's name in the header (they have the same ABI as the C
//! enum), and are checked with the enum's `from_raw`.

use std::os::raw::c_int;

use aggbox_core::{Datapath, Dtype, Status, StoreHost};

/// Status of a call: `AGGBOX_OK`, or why it failed. When a call returns
/// anything but `AGGBOX_OK`, `aggbox_last_error` on the same thread tells
/// what failed and where. The values never change between versions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_status {
    /// Success.
    AGGBOX_OK = 0,
    /// The caller passed something unusable (a NULL pointer, a size or rank
    /// out of range, a communicator another thread is using); nothing was
    /// sent. Also the status of a collective whose calls disagree across
    /// the ranks (another root, element type or count): every rank gets it,
    /// with a message that says "mismatched collective calls" and how.
    AGGBOX_ERR_INVALID_ARGUMENT = 1,
    /// An operation did not complete within the configured timeout and no
    /// particular peer is to blame.
    AGGBOX_ERR_TIMEOUT = 2,
    /// A peer did not answer within the timeout or broke the protocol; the
    /// last error names its rank.
    AGGBOX_ERR_PEER_FAILED = 3,
    /// A system call failed; the last error says which and why.
    AGGBOX_ERR_SYSTEM = 4,
    /// This host cannot do what was asked (for example the kernel datapath
    /// without CAP_BPF); the last error says how to fix it.
    AGGBOX_ERR_UNSUPPORTED = 5,
    /// A bug in AggBox. A communicator that returned it should be destroyed.
    AGGBOX_ERR_INTERNAL = 6,
}

/// An `aggbox_status` as C passes it: any `int`, checked with
/// [`aggbox_status::from_raw`]. Named `aggbox_status` in the header.
pub type RawStatus = c_int;

impl aggbox_status {
    /// Every status, in value order.
    /// cbindgen:ignore
    pub const ALL: [aggbox_status; 7] = [
        aggbox_status::AGGBOX_OK,
        aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT,
        aggbox_status::AGGBOX_ERR_TIMEOUT,
        aggbox_status::AGGBOX_ERR_PEER_FAILED,
        aggbox_status::AGGBOX_ERR_SYSTEM,
        aggbox_status::AGGBOX_ERR_UNSUPPORTED,
        aggbox_status::AGGBOX_ERR_INTERNAL,
    ];

    /// The status whose value is `raw`, if there is one.
    pub fn from_raw(raw: RawStatus) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|status| *status as RawStatus == raw)
    }

    /// A short description, as `aggbox_status_string` gives it.
    pub fn description(self) -> &'static std::ffi::CStr {
        match self {
            aggbox_status::AGGBOX_OK => c"success",
            aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT => c"invalid argument",
            aggbox_status::AGGBOX_ERR_TIMEOUT => c"timed out",
            aggbox_status::AGGBOX_ERR_PEER_FAILED => c"a peer failed",
            aggbox_status::AGGBOX_ERR_SYSTEM => c"system error",
            aggbox_status::AGGBOX_ERR_UNSUPPORTED => c"unsupported on this host",
            aggbox_status::AGGBOX_ERR_INTERNAL => c"internal error",
        }
    }
}

impl From<Status> for aggbox_status {
    fn from(status: Status) -> Self {
        match status {
            Status::Ok => aggbox_status::AGGBOX_OK,
            Status::InvalidArgument => aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT,
            Status::Timeout => aggbox_status::AGGBOX_ERR_TIMEOUT,
            Status::PeerFailed => aggbox_status::AGGBOX_ERR_PEER_FAILED,
            Status::System => aggbox_status::AGGBOX_ERR_SYSTEM,
            Status::Unsupported => aggbox_status::AGGBOX_ERR_UNSUPPORTED,
            Status::Internal => aggbox_status::AGGBOX_ERR_INTERNAL,
        }
    }
}

/// Which datapath a communicator uses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_datapath {
    /// The kernel datapath where it can be had, else the user datapath. As a
    /// request only: a communicator reports the one it picked.
    AGGBOX_DATAPATH_AUTO = 0,
    /// The BPF programs do fan-out, folding and sums; init fails with
    /// `AGGBOX_ERR_UNSUPPORTED` when they cannot be loaded.
    AGGBOX_DATAPATH_KERNEL = 1,
    /// The same wire protocol done entirely in user space.
    AGGBOX_DATAPATH_USER = 2,
}

/// An `aggbox_datapath` as C passes it: any `int`, checked with
/// [`aggbox_datapath::from_raw`]. Named `aggbox_datapath` in the header.
pub type RawDatapath = c_int;

impl aggbox_datapath {
    /// The datapath whose value is `raw`, if there is one.
    pub fn from_raw(raw: RawDatapath) -> Option<Self> {
        [
            Self::AGGBOX_DATAPATH_AUTO,
            Self::AGGBOX_DATAPATH_KERNEL,
            Self::AGGBOX_DATAPATH_USER,
        ]
        .into_iter()
        .find(|datapath| *datapath as RawDatapath == raw)
    }
}

impl From<Datapath> for aggbox_datapath {
    fn from(datapath: Datapath) -> Self {
        match datapath {
            Datapath::Auto => aggbox_datapath::AGGBOX_DATAPATH_AUTO,
            Datapath::Kernel => aggbox_datapath::AGGBOX_DATAPATH_KERNEL,
            Datapath::User => aggbox_datapath::AGGBOX_DATAPATH_USER,
        }
    }
}

impl From<aggbox_datapath> for Datapath {
    fn from(datapath: aggbox_datapath) -> Self {
        match datapath {
            aggbox_datapath::AGGBOX_DATAPATH_AUTO => Datapath::Auto,
            aggbox_datapath::AGGBOX_DATAPATH_KERNEL => Datapath::Kernel,
            aggbox_datapath::AGGBOX_DATAPATH_USER => Datapath::User,
        }
    }
}

/// Who hosts the rendezvous store a communicator joins at
/// `master_addr:master_port` (`aggbox_config.store`, like `AGGBOX_STORE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_store {
    /// Rank 0 hosts it for the length of rendezvous (`AGGBOX_STORE=rank0`,
    /// the default); a rank that restarts cannot rejoin.
    AGGBOX_STORE_RANK0 = 0,
    /// An `aggbox store` that outlives the ranks runs there
    /// (`AGGBOX_STORE=external`); every rank, rank 0 included, joins it, and a
    /// rank started again with the same rank and address rejoins its group.
    AGGBOX_STORE_EXTERNAL = 1,
}

/// An `aggbox_store` as C passes it: any `int`, checked with
/// [`aggbox_store::from_raw`]. Named `aggbox_store` in the header.
pub type RawStore = c_int;

impl aggbox_store {
    /// The store host whose value is `raw`, if there is one.
    pub fn from_raw(raw: RawStore) -> Option<Self> {
        [Self::AGGBOX_STORE_RANK0, Self::AGGBOX_STORE_EXTERNAL]
            .into_iter()
            .find(|store| *store as RawStore == raw)
    }
}

impl From<StoreHost> for aggbox_store {
    fn from(store: StoreHost) -> Self {
        match store {
            StoreHost::RankZero => aggbox_store::AGGBOX_STORE_RANK0,
            StoreHost::External => aggbox_store::AGGBOX_STORE_EXTERNAL,
        }
    }
}

impl From<aggbox_store> for StoreHost {
    fn from(store: aggbox_store) -> Self {
        match store {
            aggbox_store::AGGBOX_STORE_RANK0 => StoreHost::RankZero,
            aggbox_store::AGGBOX_STORE_EXTERNAL => StoreHost::External,
        }
    }
}

/// Element type of a buffer in a collective. The values are the wire
/// codes of the datagram header's `dtype` byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_dtype {
    /// `uint8_t` (broadcast only: bytes are not reduced).
    AGGBOX_DTYPE_U8 = 0,
    /// `int32_t`.
    AGGBOX_DTYPE_I32 = 1,
    /// `int64_t`.
    AGGBOX_DTYPE_I64 = 2,
    /// `uint32_t`.
    AGGBOX_DTYPE_U32 = 3,
    /// `uint64_t`.
    AGGBOX_DTYPE_U64 = 4,
    /// `float` (IEEE 754 binary32).
    AGGBOX_DTYPE_F32 = 5,
    /// `double` (IEEE 754 binary64).
    AGGBOX_DTYPE_F64 = 6,
}

/// An `aggbox_dtype` as C passes it, checked with
/// [`aggbox_dtype::from_raw`]. Named `aggbox_dtype` in the header.
pub type RawDtype = c_int;

impl aggbox_dtype {
    /// Every element type, in value order.
    /// cbindgen:ignore
    pub const ALL: [aggbox_dtype; 7] = [
        aggbox_dtype::AGGBOX_DTYPE_U8,
        aggbox_dtype::AGGBOX_DTYPE_I32,
        aggbox_dtype::AGGBOX_DTYPE_I64,
        aggbox_dtype::AGGBOX_DTYPE_U32,
        aggbox_dtype::AGGBOX_DTYPE_U64,
        aggbox_dtype::AGGBOX_DTYPE_F32,
        aggbox_dtype::AGGBOX_DTYPE_F64,
    ];

    /// The element type whose value is `raw`, if there is one.
    pub fn from_raw(raw: RawDtype) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|dtype| *dtype as RawDtype == raw)
    }
}

impl From<aggbox_dtype> for Dtype {
    fn from(dtype: aggbox_dtype) -> Self {
        match dtype {
            aggbox_dtype::AGGBOX_DTYPE_U8 => Dtype::U8,
            aggbox_dtype::AGGBOX_DTYPE_I32 => Dtype::I32,
            aggbox_dtype::AGGBOX_DTYPE_I64 => Dtype::I64,
            aggbox_dtype::AGGBOX_DTYPE_U32 => Dtype::U32,
            aggbox_dtype::AGGBOX_DTYPE_U64 => Dtype::U64,
            aggbox_dtype::AGGBOX_DTYPE_F32 => Dtype::F32,
            aggbox_dtype::AGGBOX_DTYPE_F64 => Dtype::F64,
        }
    }
}

/// The reduction operator of aggbox_allreduce, aggbox_reduce,
/// aggbox_reduce_scatter and aggbox_iallreduce (AVG for float types only).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_op {
    /// Sum of the contributions.
    AGGBOX_OP_SUM = 0,
    /// Smallest contribution.
    AGGBOX_OP_MIN = 1,
    /// Largest contribution.
    AGGBOX_OP_MAX = 2,
    /// Mean of the contributions (the sum divided by the number of ranks).
    AGGBOX_OP_AVG = 3,
}

/// An `aggbox_op` as C passes it. Named `aggbox_op` in the header.
pub type RawOp = c_int;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_equal_the_core_ones() {
        let core = [
            Status::Ok,
            Status::InvalidArgument,
            Status::Timeout,
            Status::PeerFailed,
            Status::System,
            Status::Unsupported,
            Status::Internal,
        ];
        for (status, core) in aggbox_status::ALL.into_iter().zip(core) {
            assert_eq!(aggbox_status::from(core), status);
            assert_eq!(status as i32, core as i32, "{status:?}");
        }
    }

    #[test]
    fn raw_values_are_checked() {
        for status in aggbox_status::ALL {
            assert_eq!(aggbox_status::from_raw(status as RawStatus), Some(status));
            assert!(!status.description().is_empty());
        }
        assert_eq!(aggbox_status::from_raw(7), None);
        assert_eq!(aggbox_status::from_raw(-1), None);

        for datapath in [Datapath::Auto, Datapath::Kernel, Datapath::User] {
            let c = aggbox_datapath::from(datapath);
            assert_eq!(aggbox_datapath::from_raw(c as RawDatapath), Some(c));
            assert_eq!(Datapath::from(c), datapath);
        }
        assert_eq!(aggbox_datapath::from_raw(3), None);
        assert_eq!(aggbox_datapath::from_raw(c_int::MIN), None);

        for store in [StoreHost::RankZero, StoreHost::External] {
            let c = aggbox_store::from(store);
            assert_eq!(aggbox_store::from_raw(c as RawStore), Some(c));
            assert_eq!(StoreHost::from(c), store);
        }
        assert_eq!(aggbox_store::from_raw(2), None);
        assert_eq!(aggbox_store::from_raw(-1), None);
    }

    #[test]
    fn dtype_values_are_the_wire_codes() {
        for (c, core) in aggbox_dtype::ALL.into_iter().zip(Dtype::ALL) {
            assert_eq!(Dtype::from(c), core);
            assert_eq!(c as RawDtype, core.code() as RawDtype, "{c:?}");
            assert_eq!(aggbox_dtype::from_raw(c as RawDtype), Some(c));
        }
        assert_eq!(aggbox_dtype::from_raw(7), None);
        assert_eq!(aggbox_dtype::from_raw(-1), None);
    }

    #[test]
    fn c_enums_have_the_size_of_int() {
        use std::mem::size_of;
        assert_eq!(size_of::<aggbox_status>(), size_of::<c_int>());
        assert_eq!(size_of::<aggbox_datapath>(), size_of::<RawDatapath>());
        assert_eq!(size_of::<aggbox_store>(), size_of::<RawStore>());
        assert_eq!(size_of::<aggbox_dtype>(), size_of::<RawDtype>());
        assert_eq!(size_of::<aggbox_op>(), size_of::<RawOp>());
    }
}
