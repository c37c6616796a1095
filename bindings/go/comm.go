package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Datapath says where a communicator's collectives run.
type Datapath int

// The datapaths; their values are those of the C library's aggbox_datapath.
const (
	// DatapathAuto asks for the kernel datapath where it can be had, else
	// the user datapath. A communicator reports the one it picked.
	DatapathAuto Datapath = C.AGGBOX_DATAPATH_AUTO
	// DatapathKernel: the BPF programs do fan-out, folding and sums; New
	// fails with ErrUnsupported when they cannot be loaded.
	DatapathKernel Datapath = C.AGGBOX_DATAPATH_KERNEL
	// DatapathUser: the same wire protocol done entirely in user space.
	DatapathUser Datapath = C.AGGBOX_DATAPATH_USER
)

// String is "auto", "kernel" or "user".
func (d Datapath) String() string {
	switch d {
	case DatapathAuto:
		return "auto"
	case DatapathKernel:
		return "kernel"
	case DatapathUser:
		return "user"
	}
	return fmt.Sprintf("Datapath(%d)", int(d))
}

// Store says who hosts the rendezvous store at MasterAddr:MasterPort.
type Store int

const (
	// StoreRankZero: rank 0 hosts it while the group forms (the default,
	// AGGBOX_STORE=rank0); a rank that restarts cannot rejoin.
	StoreRankZero Store = C.AGGBOX_STORE_RANK0
	// StoreExternal: an `aggbox store` that outlives the ranks runs there
	// (AGGBOX_STORE=external); every rank joins it, and a rank started
	// again with the same rank and address rejoins its group.
	StoreExternal Store = C.AGGBOX_STORE_EXTERNAL
)

// Config is what a communicator needs to start. The zero value of a field
// means the library's default.
type Config struct {
	// Rank of this process, 0 to WorldSize-1.
	Rank int
	// WorldSize is the number of ranks (at most 256); 0 means 1.
	WorldSize int
	// MasterAddr is the IPv4 address of the rendezvous store; "" means
	// "127.0.0.1".
	MasterAddr string
	// MasterPort is the port of the rendezvous store; 0 means 29500.
	MasterPort uint16
	// Iface is the network interface to use; "" picks the one that reaches
	// MasterAddr.
	Iface string
	// Port is the local UDP port; 0 picks a free one.
	Port uint16
	// Datapath is the datapath asked for; the zero value is DatapathAuto.
	Datapath Datapath
	// Timeout of rendezvous and of every operation; 0 means 30 s.
	Timeout time.Duration
	// Store says who hosts the rendezvous store; the zero value is
	// StoreRankZero.
	Store Store
}

// Comm is a communicator: this process's membership in a group of ranks
// that run collectives together. Its methods may be called from several
// goroutines; they are serialised. Every rank calls the collectives in
// the same order.
type Comm struct {
	mu       sync.Mutex
	state    *commState
	rank     int
	size     int
	datapath Datapath
	reason   string
	kv       *KV
	cleanup  runtime.Cleanup
}

// commState is what the cleanup of a leaked Comm frees.
type commState struct {
	h *C.aggbox_comm
}

// copyCString writes s into the C char array dst with its NUL.
func copyCString(dst []C.char, s, field string) error {
	if len(s) >= len(dst) {
		return invalid("aggbox.New: Config.%s %q is longer than %d bytes", field, s, len(dst)-1)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return invalid("aggbox.New: Config.%s holds a NUL byte", field)
	}
	for i := range dst {
		dst[i] = 0
	}
	for i := 0; i < len(s); i++ {
		dst[i] = C.char(s[i])
	}
	return nil
}

// New creates a communicator from config and joins its group: it blocks
// until every rank has joined, or fails after the timeout.
func New(config Config) (*Comm, error) {
	var c C.aggbox_config
	C.aggbox_config_init(&c)
	if config.Rank < 0 || config.Rank > math.MaxInt32 {
		return nil, invalid("aggbox.New: Config.Rank is %d, not a rank", config.Rank)
	}
	if config.WorldSize < 0 || config.WorldSize > math.MaxInt32 {
		return nil, invalid("aggbox.New: Config.WorldSize is %d, below 0", config.WorldSize)
	}
	c.rank = C.int(config.Rank)
	if config.WorldSize != 0 {
		c.world_size = C.int(config.WorldSize)
	}
	if config.MasterAddr != "" {
		if err := copyCString(c.master_addr[:], config.MasterAddr, "MasterAddr"); err != nil {
			return nil, err
		}
	}
	if config.MasterPort != 0 {
		c.master_port = C.uint16_t(config.MasterPort)
	}
	if err := copyCString(c.iface[:], config.Iface, "Iface"); err != nil {
		return nil, err
	}
	c.port = C.uint16_t(config.Port)
	c.datapath = C.aggbox_datapath(config.Datapath)
	if config.Timeout < 0 {
		return nil, invalid("aggbox.New: Config.Timeout is %v, below 0", config.Timeout)
	}
	if config.Timeout != 0 {
		ms := config.Timeout.Milliseconds()
		if ms < 1 || ms > math.MaxUint32 {
			return nil, invalid("aggbox.New: Config.Timeout %v is not between 1 ms and 2^32 ms", config.Timeout)
		}
		c.timeout_ms = C.uint32_t(ms)
	}
	c.store = C.aggbox_store(config.Store)
	var h *C.aggbox_comm
	if err := check(C.agg_comm_init(&c, &h)); err != nil {
		return nil, err
	}
	return newComm(h), nil
}

// NewFromEnv is New with the configuration taken from the environment:
// RANK, WORLD_SIZE, MASTER_ADDR (required), MASTER_PORT, AGGBOX_IFACE,
// AGGBOX_PORT, AGGBOX_DATAPATH (auto, kernel or user), AGGBOX_TIMEOUT_MS
// and AGGBOX_STORE (rank0 or external).
func NewFromEnv() (*Comm, error) {
	var h *C.aggbox_comm
	if err := check(C.agg_comm_init_from_env(&h)); err != nil {
		return nil, err
	}
	return newComm(h), nil
}

func newComm(h *C.aggbox_comm) *Comm {
	state := &commState{h: h}
	c := &Comm{
		state:    state,
		rank:     int(C.aggbox_comm_rank(h)),
		size:     int(C.aggbox_comm_size(h)),
		datapath: Datapath(C.aggbox_comm_datapath(h)),
	}
	if reason := C.agg_datapath_reason(h); reason != nil {
		c.reason = C.GoString(reason)
		C.free(unsafe.Pointer(reason))
	}
	c.cleanup = runtime.AddCleanup(c, func(s *commState) {
		if s.h != nil {
			C.aggbox_comm_destroy(s.h)
			s.h = nil
		}
	}, state)
	return c
}

// Close leaves the group and frees the communicator, after the
// asynchronous operations still pending on it have finished (their
// requests stay valid). A key-value reduce still open on it is ended and
// its result dropped. Close is idempotent, and always returns nil.
func (c *Comm) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state.h == nil {
		return nil
	}
	if c.kv != nil {
		c.kv.abandon()
	}
	C.aggbox_comm_destroy(c.state.h)
	c.state.h = nil
	c.cleanup.Stop()
	return nil
}

// lock locks c for one call named op and returns its handle, or an error
// when c is nil or closed; unlock with c.mu.Unlock when it returned nil.
func (c *Comm) lock(op string) (*C.aggbox_comm, error) {
	if c == nil {
		return nil, invalid("%s: the communicator is nil", op)
	}
	c.mu.Lock()
	if c.state.h == nil {
		c.mu.Unlock()
		return nil, closed(op, "communicator")
	}
	return c.state.h, nil
}

// Rank is this process's rank in the group.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Comm) Size() int { return c.size }

// Datapath is the datapath the communicator uses (DatapathKernel or
// DatapathUser) and, when DatapathAuto fell back to the user datapath,
// why; the reason is "" otherwise.
func (c *Comm) Datapath() (Datapath, string) { return c.datapath, c.reason }

// Barrier blocks until every rank of the group has called Barrier.
func (c *Comm) Barrier() error {
	h, err := c.lock("aggbox_barrier")
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return check(C.agg_barrier(h))
}

// Version is the version of the C library, such as "0.1.0".
func Version() string { return C.GoString(C.aggbox_version()) }

// ABIVersion is the ABI version the C library implements; ABIVersionBuilt
// is the one this package was compiled against.
func ABIVersion() int { return int(C.aggbox_abi_version()) }

// ABIVersionBuilt is the AGGBOX_ABI_VERSION of the header this package was
// compiled against.
const ABIVersionBuilt = C.AGGBOX_ABI_VERSION
