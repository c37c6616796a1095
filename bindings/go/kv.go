package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"iter"
	"math"
	"strconv"
	"unsafe"
)

// ValueType is the type of the values of a key-value reduce.
type ValueType int

const (
	// Int64 values (the default); emitted with KV.Emit.
	Int64 ValueType = iota
	// Uint64 values; emitted with KV.EmitUint64.
	Uint64
	// Float64 values; emitted with KV.EmitFloat64.
	Float64
)

// String is "int64", "uint64" or "float64".
func (t ValueType) String() string {
	switch t {
	case Int64:
		return "int64"
	case Uint64:
		return "uint64"
	case Float64:
		return "float64"
	}
	return "ValueType(" + strconv.Itoa(int(t)) + ")"
}

func (t ValueType) dtype() (C.aggbox_dtype, bool) {
	switch t {
	case Int64:
		return C.AGGBOX_DTYPE_I64, true
	case Uint64:
		return C.AGGBOX_DTYPE_U64, true
	case Float64:
		return C.AGGBOX_DTYPE_F64, true
	}
	return 0, false
}

// KVConfig is what a key-value reduce does; the same on every rank. The
// zero value of a field means the library's default.
type KVConfig struct {
	// KeyMax is the longest key in bytes, 32 to 1024; 0 means 64.
	KeyMax int
	// Type of the values; the zero value is Int64.
	Type ValueType
	// Op combines the values of one key: OpSum (the zero value), OpMin or
	// OpMax.
	Op Op
	// KernelCapacity is the most keys the owner's kernel table holds on the
	// kernel datapath (more spill to user space, still exact); 0 means
	// 65536.
	KernelCapacity uint64
	// NoCombine sends every pair as it is, instead of folding the pairs
	// of one key bound for one owner into one before sending them.
	NoCombine bool
}

// kvBatch is how many pairs Emit buffers before it hands them to the
// library in one call.
const kvBatch = 1024

// KV is an open key-value reduce: every rank emits pairs, and each key's
// values are combined at the rank that owns it (fnv1a64(key) mod Size()).
// Made by Comm.KVBegin, ended by Finish.
type KV struct {
	comm   *Comm
	h      *C.aggbox_kv
	typ    ValueType
	keyMax int
	keys   []byte
	lens   []uint32
	values []uint64
	err    error
}

// KVBegin opens a key-value reduce on c (a collective: every rank opens
// it with the same config, in the same order as its other collectives).
// One at a time per communicator.
func (c *Comm) KVBegin(config KVConfig) (*KV, error) {
	const name = "aggbox_kv_begin"
	var cfg C.aggbox_kv_config
	C.aggbox_kv_config_init(&cfg)
	if config.KeyMax < 0 || config.KeyMax > math.MaxUint32 {
		return nil, invalid("%s: KVConfig.KeyMax is %d, not between 32 and 1024", name, config.KeyMax)
	}
	if config.KeyMax != 0 {
		cfg.key_max = C.uint32_t(config.KeyMax)
	}
	dt, ok := config.Type.dtype()
	if !ok {
		return nil, invalid("%s: KVConfig.Type is %v, not Int64, Uint64 or Float64", name, config.Type)
	}
	cfg.dtype = dt
	cfg.op = C.aggbox_op(config.Op)
	if config.KernelCapacity != 0 {
		cfg.kernel_capacity = C.uint64_t(config.KernelCapacity)
	}
	if config.NoCombine {
		cfg.combine = 0
	}
	h, err := c.lock(name)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if c.kv != nil {
		return nil, invalid("%s: a key-value reduce is already open on this communicator: Finish it first", name)
	}
	var out *C.aggbox_kv
	if err := check(C.agg_kv_begin(h, &cfg, &out)); err != nil {
		return nil, err
	}
	kv := &KV{comm: c, h: out, typ: config.Type, keyMax: int(cfg.key_max)}
	c.kv = kv
	return kv, nil
}

// add buffers one pair, after checking it; the library gets the buffered
// pairs kvBatch at a time.
func (kv *KV) add(op string, typ ValueType, key []byte, bits uint64) error {
	if kv == nil {
		return invalid("%s: the key-value reduce is nil", op)
	}
	kv.comm.mu.Lock()
	open, err := kv.h != nil, kv.err
	kv.comm.mu.Unlock()
	if !open {
		if err != nil {
			return err
		}
		return closed(op, "key-value reduce")
	}
	if kv.typ != typ {
		return invalid("%s: the values of this key-value reduce are %v, not %v", op, kv.typ, typ)
	}
	if len(key) == 0 || len(key) > kv.keyMax {
		return invalid("%s: a key has %d bytes, not 1 to KeyMax (%d)", op, len(key), kv.keyMax)
	}
	kv.keys = append(kv.keys, key...)
	kv.lens = append(kv.lens, uint32(len(key)))
	kv.values = append(kv.values, bits)
	if len(kv.lens) >= kvBatch {
		return kv.flush(op)
	}
	return nil
}

// flush hands the buffered pairs to the library.
func (kv *KV) flush(op string) error {
	c := kv.comm
	c.mu.Lock()
	defer c.mu.Unlock()
	if kv.h == nil {
		if kv.err != nil {
			return kv.err
		}
		return closed(op, "key-value reduce")
	}
	if len(kv.lens) == 0 {
		return nil
	}
	err := check(C.agg_kv_emit(kv.h, (*C.uint8_t)(data(kv.keys)), (*C.uint32_t)(data(kv.lens)),
		data(kv.values), C.size_t(len(kv.lens))))
	kv.keys, kv.lens, kv.values = kv.keys[:0], kv.lens[:0], kv.values[:0]
	if err != nil && kv.err == nil {
		kv.err = err
	}
	return err
}

// Emit emits the pair (key, value) of a reduce of Int64 values. Pairs are
// buffered and handed to the library 1024 at a time, so the error of the
// library (a peer that failed, which ends the operation) may come from a
// later Emit or from Finish; a bad key is refused at once.
func (kv *KV) Emit(key []byte, value int64) error {
	return kv.add("aggbox_kv_emit", Int64, key, uint64(value))
}

// EmitUint64 is Emit for a reduce of Uint64 values.
func (kv *KV) EmitUint64(key []byte, value uint64) error {
	return kv.add("aggbox_kv_emit", Uint64, key, value)
}

// EmitFloat64 is Emit for a reduce of Float64 values.
func (kv *KV) EmitFloat64(key []byte, value float64) error {
	return kv.add("aggbox_kv_emit", Float64, key, math.Float64bits(value))
}

// abandon ends the operation and drops its result; c.mu is held.
func (kv *KV) abandon() {
	if kv.h != nil {
		var out *C.aggbox_kv_result
		C.agg_kv_finish(kv.h, &out) // frees kv.h whatever happens
		C.aggbox_kv_result_free(out)
		kv.h = nil
	}
	kv.err = closed("aggbox_kv_finish", "communicator")
	kv.comm.kv = nil
}

// Finish ends the key-value reduce (a collective) and returns the reduced
// pairs of the keys this rank owns, sorted by key bytes. The KV cannot be
// used afterwards, whether Finish succeeded or not.
func (kv *KV) Finish() (*KVResult, error) {
	const name = "aggbox_kv_finish"
	if kv == nil {
		return nil, invalid("%s: the key-value reduce is nil", name)
	}
	flushErr := kv.flush(name)
	c := kv.comm
	c.mu.Lock()
	defer c.mu.Unlock()
	if kv.h == nil {
		if kv.err != nil {
			return nil, kv.err
		}
		return nil, closed(name, "key-value reduce")
	}
	var out *C.aggbox_kv_result
	err := check(C.agg_kv_finish(kv.h, &out))
	kv.h = nil
	c.kv = nil
	if err == nil && flushErr != nil {
		err = flushErr
	}
	if err != nil {
		C.aggbox_kv_result_free(out)
		kv.err = err
		return nil, err
	}
	defer C.aggbox_kv_result_free(out)
	n := int(C.aggbox_kv_result_len(out))
	result := &KVResult{typ: kv.typ, keys: make([]string, n), bits: make([]uint64, n)}
	for i := range n {
		var key *C.uint8_t
		var keyLen C.uint32_t
		var value C.uint64_t
		if err := check(C.agg_kv_result_get(out, C.size_t(i), &key, &keyLen, &value)); err != nil {
			return nil, err
		}
		result.keys[i] = string(unsafe.Slice((*byte)(unsafe.Pointer(key)), int(keyLen)))
		result.bits[i] = uint64(value)
	}
	var stats C.aggbox_kv_stats
	if err := check(C.agg_kv_result_stats(out, &stats)); err != nil {
		return nil, err
	}
	result.stats = kvStatsOf(&stats)
	kv.err = closed(name, "key-value reduce")
	return result, nil
}

// KVResult is the reduced pairs of the keys one rank owns, sorted by key
// bytes, held in Go memory.
type KVResult struct {
	typ   ValueType
	keys  []string
	bits  []uint64
	stats KVStats
}

// Value is a reduced value, of the reduce's ValueType.
type Value struct {
	bits uint64
	typ  ValueType
}

// Int64 is the value of an Int64 reduce.
func (v Value) Int64() int64 { return int64(v.bits) }

// Uint64 is the value of a Uint64 reduce.
func (v Value) Uint64() uint64 { return v.bits }

// Float64 is the value of a Float64 reduce.
func (v Value) Float64() float64 { return math.Float64frombits(v.bits) }

// Type is the type of the value.
func (v Value) Type() ValueType { return v.typ }

// String formats the value as its type says.
func (v Value) String() string {
	switch v.typ {
	case Uint64:
		return strconv.FormatUint(v.bits, 10)
	case Float64:
		return strconv.FormatFloat(v.Float64(), 'g', -1, 64)
	}
	return strconv.FormatInt(v.Int64(), 10)
}

// Len is the number of keys this rank owns.
func (r *KVResult) Len() int { return len(r.keys) }

// Key is key i, 0 ≤ i < Len().
func (r *KVResult) Key(i int) string { return r.keys[i] }

// Value is the value of key i.
func (r *KVResult) Value(i int) Value { return Value{r.bits[i], r.typ} }

// All yields every key this rank owns and its value, in key order.
func (r *KVResult) All() iter.Seq2[string, Value] {
	return func(yield func(string, Value) bool) {
		for i, k := range r.keys {
			if !yield(k, Value{r.bits[i], r.typ}) {
				return
			}
		}
	}
}

// Map is the pairs as a map.
func (r *KVResult) Map() map[string]Value {
	m := make(map[string]Value, len(r.keys))
	for k, v := range r.All() {
		m[k] = v
	}
	return m
}

// Stats is what the operation did at this rank.
func (r *KVResult) Stats() KVStats { return r.stats }
