package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"math"
	"reflect"
	"strconv"
	"unsafe"
)

// Number is an element type the reductions take.
type Number interface {
	~int32 | ~int64 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// Element is an element type Broadcast and Allgather take: a Number or a
// byte (bytes are moved, not reduced).
type Element interface {
	Number | ~uint8
}

// Op is the reduction operator of Allreduce, Reduce, ReduceScatter and
// IAllreduce, and of a key-value reduce (SUM, MIN and MAX there).
type Op int

// The operators; their values are those of the C library's aggbox_op.
const (
	// OpSum adds the contributions (wrapping around on integers; float
	// sums are exact to within the bound of the C library's
	// aggbox_allreduce, and bit for bit the same on every rank).
	OpSum Op = C.AGGBOX_OP_SUM
	// OpMin takes the smallest contribution.
	OpMin Op = C.AGGBOX_OP_MIN
	// OpMax takes the largest contribution.
	OpMax Op = C.AGGBOX_OP_MAX
	// OpAvg is the sum divided by the number of ranks (floats only).
	OpAvg Op = C.AGGBOX_OP_AVG
)

// String is "sum", "min", "max" or "avg".
func (o Op) String() string {
	switch o {
	case OpSum:
		return "sum"
	case OpMin:
		return "min"
	case OpMax:
		return "max"
	case OpAvg:
		return "avg"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// dtype is the aggbox_dtype of T.
func dtype[T Element]() C.int {
	switch reflect.TypeFor[T]().Kind() {
	case reflect.Uint8:
		return C.AGGBOX_DTYPE_U8
	case reflect.Int32:
		return C.AGGBOX_DTYPE_I32
	case reflect.Int64:
		return C.AGGBOX_DTYPE_I64
	case reflect.Uint32:
		return C.AGGBOX_DTYPE_U32
	case reflect.Uint64:
		return C.AGGBOX_DTYPE_U64
	case reflect.Float32:
		return C.AGGBOX_DTYPE_F32
	case reflect.Float64:
		return C.AGGBOX_DTYPE_F64
	}
	panic("unreachable: the constraint allows no other kind")
}

// data is the address of s's first element, nil when s is empty.
func data[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(s))
}

// cRoot checks that root fits in a C int (the library checks that it is
// a rank).
func cRoot(op string, root int) (C.int, error) {
	if root < math.MinInt32 || root > math.MaxInt32 {
		return 0, invalid("%s: root %d is not a rank", op, root)
	}
	return C.int(root), nil
}

// Broadcast sends rank root's buf to every rank, in place: when it returns
// nil, every rank's buf holds what the root's held. Every rank passes a
// buf of the same length.
func Broadcast[T Element](c *Comm, buf []T, root int) error {
	const op = "aggbox_broadcast"
	r, err := cRoot(op, root)
	if err != nil {
		return err
	}
	h, err := c.lock(op)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return check(C.agg_broadcast(h, data(buf), C.size_t(len(buf)), dtype[T](), r))
}

// Allreduce reduces send with op across every rank into recv: when it
// returns nil, every rank's recv[i] is op over the ranks' send[i]. send
// and recv have the same length; passing the same slice twice reduces in
// place, otherwise the two must not overlap.
func Allreduce[T Number](c *Comm, send, recv []T, op Op) error {
	const name = "aggbox_allreduce"
	if len(send) != len(recv) {
		return invalid("%s: send has %d elements, recv %d: they must have the same length", name, len(send), len(recv))
	}
	h, err := c.lock(name)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return check(C.agg_allreduce(h, data(send), data(recv), C.size_t(len(send)), dtype[T](), C.int(op)))
}

// Reduce reduces send with op across every rank into recv at rank root:
// when it returns nil at the root, recv[i] is op over the ranks' send[i].
// recv is used only at the root, where it has the length of send (the same
// slice reduces in place); elsewhere it may be nil. A rank other than the
// root may return before the root has its result.
func Reduce[T Number](c *Comm, send, recv []T, op Op, root int) error {
	const name = "aggbox_reduce"
	r, err := cRoot(name, root)
	if err != nil {
		return err
	}
	if c != nil && root == c.rank && len(recv) != len(send) {
		return invalid("%s: send has %d elements, the root's recv %d: they must have the same length", name, len(send), len(recv))
	}
	h, err := c.lock(name)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	var out unsafe.Pointer
	if root == c.rank {
		out = data(recv)
	}
	return check(C.agg_reduce(h, data(send), out, C.size_t(len(send)), dtype[T](), C.int(op), r))
}

// ReduceScatter reduces send (Size() × len(recv) elements) with op across
// every rank and scatters the result: when it returns nil, rank r's
// recv[i] is op over the ranks' send[r×len(recv)+i]. The two must not
// overlap.
func ReduceScatter[T Number](c *Comm, send, recv []T, op Op) error {
	const name = "aggbox_reduce_scatter"
	if c != nil && len(send) != c.size*len(recv) {
		return invalid("%s: send has %d elements, not %d ranks x the %d of recv", name, len(send), c.size, len(recv))
	}
	h, err := c.lock(name)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return check(C.agg_reduce_scatter(h, data(send), data(recv), C.size_t(len(recv)), dtype[T](), C.int(op)))
}

// Allgather gathers every rank's send onto every rank: when it returns
// nil, recv[r×len(send):(r+1)×len(send)] holds rank r's send, for every
// rank r. recv has Size() × len(send) elements; the two must not overlap.
func Allgather[T Element](c *Comm, send, recv []T) error {
	const name = "aggbox_allgather"
	if c != nil && len(recv) != c.size*len(send) {
		return invalid("%s: recv has %d elements, not %d ranks x the %d of send", name, len(recv), c.size, len(send))
	}
	h, err := c.lock(name)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return check(C.agg_allgather(h, data(send), data(recv), C.size_t(len(send)), dtype[T]()))
}

// IAllreduce starts the Allreduce of send into recv (same arguments, same
// checks, made before it returns) and returns at once. Until the request
// has finished (Wait returned, or Test said done), both slices belong to
// the library: do not write them or read recv. They are pinned
// (runtime.Pinner) until then. Operations started on a communicator run
// in the order they were started; a blocking call meanwhile waits for
// its turn.
func IAllreduce[T Number](c *Comm, send, recv []T, op Op) (*Request, error) {
	const name = "aggbox_iallreduce"
	if len(send) != len(recv) {
		return nil, invalid("%s: send has %d elements, recv %d: they must have the same length", name, len(send), len(recv))
	}
	h, err := c.lock(name)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	req := newRequest(data(send), data(recv))
	var out *C.aggbox_request
	err = check(C.agg_iallreduce(h, data(send), data(recv), C.size_t(len(send)), dtype[T](), C.int(op), &out))
	return req.started(out, err)
}

// IBroadcast starts the Broadcast of buf from root and returns at once;
// buf belongs to the library, pinned, until the request has finished (see
// IAllreduce).
func IBroadcast[T Element](c *Comm, buf []T, root int) (*Request, error) {
	const name = "aggbox_ibroadcast"
	r, err := cRoot(name, root)
	if err != nil {
		return nil, err
	}
	h, err := c.lock(name)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	req := newRequest(data(buf))
	var out *C.aggbox_request
	err = check(C.agg_ibroadcast(h, data(buf), C.size_t(len(buf)), dtype[T](), r, &out))
	return req.started(out, err)
}
