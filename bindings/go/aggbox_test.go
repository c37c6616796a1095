package aggbox

// The binding against the real library: several ranks in this one process
// on loopback (the user datapath), each on its own goroutine; every
// result is checked against a plain loop over the ranks' inputs.

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// freePort is a TCP port nothing listens on now, for a group's rendezvous.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// group makes n loopback ranks on the user datapath, closed when the test
// ends.
func group(t *testing.T, n int) []*Comm {
	t.Helper()
	return groupWith(t, n, Config{MasterPort: freePort(t)})
}

func groupWith(t *testing.T, n int, base Config) []*Comm {
	t.Helper()
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			config := base
			config.Rank, config.WorldSize = r, n
			config.Datapath = DatapathUser
			if config.Timeout == 0 {
				config.Timeout = 10 * time.Second
			}
			comms[r], errs[r] = New(config)
		}()
	}
	wg.Wait()
	t.Cleanup(func() { closeAll(comms) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: New: %v", r, err)
		}
	}
	return comms
}

// closeAll closes every rank at once, as the ranks of a job end: leaving
// a group waits for the others to leave too.
func closeAll(comms []*Comm) {
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Close()
		}()
	}
	wg.Wait()
}

// onEvery runs f on every rank at once and fails the test with the errors
// it returned.
func onEvery(t *testing.T, comms []*Comm, f func(c *Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// input is rank r's element i: small signed integers that differ across
// ranks and indices (the unsigned types get them modulo 2^bits).
func input[T Number](r, i int) T {
	v := int64((r*7919+i*104729)%2001) - 1000
	var zero T
	switch any(zero).(type) {
	case uint32, uint64:
		return T(uint64(v + 1000))
	}
	return T(v)
}

// reference is op over the ranks' inputs at index i, as a plain loop.
func reference[T Number](op Op, n, i int) float64 {
	acc := float64(input[T](0, i))
	for r := 1; r < n; r++ {
		x := float64(input[T](r, i))
		switch op {
		case OpSum, OpAvg:
			acc += x
		case OpMin:
			acc = math.Min(acc, x)
		case OpMax:
			acc = math.Max(acc, x)
		}
	}
	if op == OpAvg {
		acc /= float64(n)
	}
	return acc
}

// tolerance is the bound of a float sum of the C library's
// aggbox_allreduce (an integer sum is exact).
func tolerance[T Number](op Op, n int) float64 {
	var zero T
	switch any(zero).(type) {
	case float32:
		if op == OpSum || op == OpAvg {
			return 3.0e-7 * float64(n) * 1000
		}
	case float64:
		if op == OpSum || op == OpAvg {
			return 1.2e-16 * float64(n) * 1000
		}
	}
	return 0
}

func checkAllreduce[T Number](t *testing.T, comms []*Comm, op Op, count int, inPlace bool) {
	t.Helper()
	n := len(comms)
	results := make([][]T, n)
	onEvery(t, comms, func(c *Comm) error {
		send := make([]T, count)
		for i := range send {
			send[i] = input[T](c.Rank(), i)
		}
		recv := send
		if !inPlace {
			recv = make([]T, count)
		}
		results[c.Rank()] = recv
		return Allreduce(c, send, recv, op)
	})
	name := fmt.Sprintf("%T %v count %d in place %v", *new(T), op, count, inPlace)
	tol := tolerance[T](op, n)
	for i := range count {
		want := reference[T](op, n, i)
		if _, isInt := any(*new(T)).(int32); isInt && op == OpSum {
			want = float64(int32(want))
		}
		got := float64(results[0][i])
		if math.Abs(got-want) > tol {
			t.Fatalf("%s: element %d is %v, the loop says %v", name, i, got, want)
		}
		for r := 1; r < n; r++ {
			if results[r][i] != results[0][i] {
				t.Fatalf("%s: rank %d's element %d is %v, rank 0's %v", name, r, i, results[r][i], results[0][i])
			}
		}
	}
}

func TestAllreduceMatchesALoop(t *testing.T) {
	comms := group(t, 4)
	for _, count := range []int{0, 1, 1000, 100003} {
		for _, op := range []Op{OpSum, OpMin, OpMax} {
			checkAllreduce[int32](t, comms, op, count, false)
			checkAllreduce[int64](t, comms, op, count, count%2 == 0)
			checkAllreduce[uint32](t, comms, op, count, true)
			checkAllreduce[uint64](t, comms, op, count, false)
			checkAllreduce[float32](t, comms, op, count, false)
			checkAllreduce[float64](t, comms, op, count, true)
		}
		checkAllreduce[float32](t, comms, OpAvg, count, true)
		checkAllreduce[float64](t, comms, OpAvg, count, false)
	}
}

// A named type whose underlying type is a Number works as that type.
type weight float64

func TestNamedElementTypes(t *testing.T) {
	comms := group(t, 2)
	onEvery(t, comms, func(c *Comm) error {
		w := []weight{weight(c.Rank() + 1), 10}
		if err := Allreduce(c, w, w, OpSum); err != nil {
			return err
		}
		if w[0] != 3 || w[1] != 20 {
			return fmt.Errorf("got %v, want [3 20]", w)
		}
		return nil
	})
}

func TestBroadcastFromEveryRoot(t *testing.T) {
	comms := group(t, 3)
	for root := range 3 {
		for _, size := range []int{0, 1, 5000, 300001} {
			onEvery(t, comms, func(c *Comm) error {
				buf := make([]byte, size)
				if c.Rank() == root {
					for i := range buf {
						buf[i] = byte(i*31 + root)
					}
				}
				if err := Broadcast(c, buf, root); err != nil {
					return err
				}
				for i, b := range buf {
					if b != byte(i*31+root) {
						return fmt.Errorf("root %d size %d: byte %d is %d", root, size, i, b)
					}
				}
				f := []float64{0, 0}
				if c.Rank() == root {
					f = []float64{math.Pi, -float64(root)}
				}
				if err := Broadcast(c, f, root); err != nil {
					return err
				}
				if f[0] != math.Pi || f[1] != -float64(root) {
					return fmt.Errorf("root %d: got %v", root, f)
				}
				return nil
			})
		}
	}
}

func TestReduceReduceScatterAllgather(t *testing.T) {
	comms := group(t, 4)
	const count = 1001
	onEvery(t, comms, func(c *Comm) error {
		n, me := c.Size(), c.Rank()
		send := make([]int64, count)
		for i := range send {
			send[i] = input[int64](me, i)
		}
		// Reduce to rank 2: only the root needs recv.
		var recv []int64
		if me == 2 {
			recv = make([]int64, count)
		}
		if err := Reduce(c, send, recv, OpMax, 2); err != nil {
			return err
		}
		if me == 2 {
			for i, v := range recv {
				if want := reference[int64](OpMax, n, i); float64(v) != want {
					return fmt.Errorf("reduce: element %d is %d, the loop says %v", i, v, want)
				}
			}
		}
		// Reduce-scatter of n blocks of 250.
		block := 250
		big := make([]float64, n*block)
		for i := range big {
			big[i] = input[float64](me, i)
		}
		mine := make([]float64, block)
		if err := ReduceScatter(c, big, mine, OpMin); err != nil {
			return err
		}
		for i, v := range mine {
			if want := reference[float64](OpMin, n, me*block+i); v != want {
				return fmt.Errorf("reduce-scatter: element %d is %v, the loop says %v", i, v, want)
			}
		}
		// Allgather of 3 uint32 and of 2 bytes per rank.
		part := []uint32{uint32(me), uint32(me * 10), uint32(me * 100)}
		all := make([]uint32, 3*n)
		if err := Allgather(c, part, all); err != nil {
			return err
		}
		for r := range n {
			if all[3*r] != uint32(r) || all[3*r+1] != uint32(10*r) || all[3*r+2] != uint32(100*r) {
				return fmt.Errorf("allgather: got %v", all)
			}
		}
		name := []byte{'a' + byte(me), '!'}
		names := make([]byte, 2*n)
		if err := Allgather(c, name, names); err != nil {
			return err
		}
		if want := "a!b!c!d!"; string(names) != want {
			return fmt.Errorf("allgather of bytes: %q, want %q", names, want)
		}
		return nil
	})
}

func TestAsynchronousOperations(t *testing.T) {
	comms := group(t, 3)
	const count = 200003
	onEvery(t, comms, func(c *Comm) error {
		send := make([]float64, count)
		for i := range send {
			send[i] = input[float64](c.Rank(), i)
		}
		recv := make([]float64, count)
		req, err := IAllreduce(c, send, recv, OpSum)
		if err != nil {
			return err
		}
		buf := make([]int32, 1000)
		if c.Rank() == 1 {
			for i := range buf {
				buf[i] = int32(i * i)
			}
		}
		breq, err := IBroadcast(c, buf, 1)
		if err != nil {
			return err
		}
		runtime.GC() // the pinned buffers stay put
		for {
			done, err := req.Test()
			if err != nil {
				return err
			}
			if done {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := breq.Wait(); err != nil {
			return err
		}
		if err := breq.Wait(); err != nil { // waiting again gives the same
			return err
		}
		if done, err := req.Test(); !done || err != nil {
			return fmt.Errorf("Test after done: %v %v", done, err)
		}
		for i, v := range recv {
			if want := reference[float64](OpSum, 3, i); math.Abs(v-want) > tolerance[float64](OpSum, 3) {
				return fmt.Errorf("iallreduce: element %d is %v, the loop says %v", i, v, want)
			}
		}
		for i, v := range buf {
			if v != int32(i*i) {
				return fmt.Errorf("ibroadcast: element %d is %d", i, v)
			}
		}
		// A request dropped unfinished is waited for and freed by its
		// cleanup; the blocking barrier queues behind it.
		if _, err := IAllreduce(c, send, send, OpMax); err != nil {
			return err
		}
		return c.Barrier()
	})
	runtime.GC()
	runtime.GC()
}

func TestOneRankBasicsAndClose(t *testing.T) {
	c, err := New(Config{MasterPort: freePort(t), Datapath: DatapathUser})
	if err != nil {
		t.Fatal(err)
	}
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("rank %d size %d", c.Rank(), c.Size())
	}
	if dp, reason := c.Datapath(); dp != DatapathUser || reason != "" {
		t.Fatalf("datapath %v %q", dp, reason)
	}
	for range 3 {
		if err := c.Barrier(); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Stats(); s.Barriers != 3 || s.Datapath != DatapathUser {
		t.Fatalf("stats %+v", s)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("a second Close:", err)
	}
	err = c.Barrier()
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("barrier after Close: %v", err)
	}
	if err := Allreduce(c, []int32{1}, []int32{1}, OpSum); !errors.Is(err, ErrClosed) {
		t.Fatalf("allreduce after Close: %v", err)
	}
	if s := c.Stats(); s != (Stats{}) {
		t.Fatalf("stats after Close: %+v", s)
	}
	if Version() == "" || ABIVersion() != ABIVersionBuilt {
		t.Fatalf("version %q abi %d, built for %d", Version(), ABIVersion(), ABIVersionBuilt)
	}
}

func TestAutoOnLoopbackSaysWhyItFellBack(t *testing.T) {
	c, err := New(Config{MasterPort: freePort(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dp, reason := c.Datapath()
	if dp != DatapathUser || !strings.Contains(reason, "loopback") {
		t.Fatalf("datapath %v, reason %q", dp, reason)
	}
}

// Bad input is an error, never a panic or a crash, and nothing is sent
// (the one-rank communicator keeps working).
func TestBadInputIsAnError(t *testing.T) {
	c, err := New(Config{MasterPort: freePort(t), Datapath: DatapathUser})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var nilComm *Comm
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil communicator", nilComm.Barrier(), "the communicator is nil"},
		{"nil communicator broadcast", Broadcast(nilComm, []byte{1}, 0), "the communicator is nil"},
		{"mismatched lengths", Allreduce(c, make([]float32, 3), make([]float32, 4), OpSum), "send has 3 elements, recv 4"},
		{"nil recv with count", Allreduce(c, make([]int64, 3), nil, OpSum), "send has 3 elements, recv 0"},
		{"wrong root", Broadcast(c, make([]byte, 8), 1), "root"},
		{"negative root", Broadcast(c, make([]byte, 8), -1), "root"},
		{"huge root", Reduce(c, []int32{1}, []int32{0}, OpSum, 1<<40), "root 1099511627776 is not a rank"},
		{"reduce root recv", Reduce(c, []int32{1, 2}, []int32{0}, OpSum, 0), "the root's recv 1"},
		{"avg of integers", Allreduce(c, []int32{1}, []int32{0}, OpAvg), "avg is for f32 and f64"},
		{"unknown op", Allreduce(c, []int32{1}, []int32{0}, Op(9)), "op"},
		{"overlap", Allreduce(c, make([]int64, 4)[:3], nil, OpSum), "recv 0"},
		{"reduce-scatter lengths", ReduceScatter(c, make([]int32, 3), make([]int32, 2), OpSum), "not 1 ranks x the 2 of recv"},
		{"allgather lengths", Allgather(c, make([]byte, 3), make([]byte, 2)), "recv has 2 elements, not 1 ranks x the 3 of send"},
	}
	buf := make([]int64, 8)
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"overlapping slices", Allreduce(c, buf[0:4], buf[2:6], OpSum), "overlap"})
	_, ierr := IAllreduce(c, make([]int32, 2), make([]int32, 1), OpSum)
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"iallreduce lengths", ierr, "send has 2 elements, recv 1"})
	_, ierr = IBroadcast(c, make([]int32, 2), 3)
	cases = append(cases, struct {
		name string
		err  error
		want string
	}{"ibroadcast root", ierr, "root"})
	for _, tc := range cases {
		var e *Error
		if !errors.As(tc.err, &e) || !errors.Is(tc.err, ErrInvalidArgument) {
			t.Errorf("%s: %v is not an invalid-argument *Error", tc.name, tc.err)
			continue
		}
		if !strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: %q does not say %q", tc.name, e.Message, tc.want)
		}
	}
	if err := c.Barrier(); err != nil {
		t.Fatal("the communicator is still usable:", err)
	}
	var nilReq *Request
	if err := nilReq.Wait(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestBadConfigIsAnError(t *testing.T) {
	for _, tc := range []struct {
		config Config
		want   string
	}{
		{Config{Rank: 3, WorldSize: 2}, "rank 3 is not below the world size 2"},
		{Config{Rank: -1}, "Config.Rank is -1"},
		{Config{MasterAddr: "master.example"}, "is not an IPv4 address"},
		{Config{MasterAddr: strings.Repeat("1", 64)}, "longer than 63 bytes"},
		{Config{Iface: "eth\x000"}, "NUL"},
		{Config{Datapath: Datapath(7)}, "config->datapath is 7"},
		{Config{Store: Store(5)}, "config->store is 5"},
		{Config{Timeout: -time.Second}, "Config.Timeout"},
		{Config{WorldSize: 1000}, "world"},
	} {
		c, err := New(tc.config)
		if c != nil || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, %v; want an invalid argument saying %q", tc.config, c, err, tc.want)
		}
	}
}

// The ranks' calls disagree: every rank gets ErrInvalidArgument saying so,
// long before the timeout.
func TestMismatchedCallsFailEveryRank(t *testing.T) {
	comms := group(t, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]int32, 10+r)
			errs[r] = Allreduce(c, buf, buf, OpSum)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "mismatched collective calls") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// A rank that left is named by the others' error.
func TestAPeerThatLeftIsNamed(t *testing.T) {
	comms := groupWith(t, 2, Config{MasterPort: freePort(t), Timeout: 1500 * time.Millisecond})
	comms[1].Close()
	err := comms[0].Barrier()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrPeerFailed) || !strings.Contains(e.Message, "rank 1") {
		t.Errorf("%v; want a peer failure naming rank 1", err)
	}
	if errors.Is(err, ErrTimeout) {
		t.Errorf("%v is also a timeout", err)
	}
}

// Two goroutines on one communicator at once are serialised.
func TestConcurrentCallsAreSerialised(t *testing.T) {
	comms := group(t, 2)
	onEvery(t, comms, func(c *Comm) error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					// Each rank's two goroutines run the same sequence of
					// barriers and stats; any interleaving gives every rank
					// the same number of barriers.
					if err := c.Barrier(); err != nil {
						errs[g] = err
						return
					}
					_ = c.Stats()
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if got := c.Stats().Barriers; got != 40 {
			return fmt.Errorf("%d barriers, want 40", got)
		}
		return nil
	})
}

func TestCloseRacingCallsNeverCrashes(t *testing.T) {
	c, err := New(Config{MasterPort: freePort(t), Datapath: DatapathUser})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				err := c.Barrier()
				if err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
					return
				}
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	c.Close()
	wg.Wait()
}

// A communicator never closed is closed by its cleanup once it is garbage:
// the UDP port it held is free again.
func TestLeakedCommunicatorIsFreed(t *testing.T) {
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(udp.LocalAddr().(*net.UDPAddr).Port)
	udp.Close()
	config := Config{MasterPort: freePort(t), Port: port, Datapath: DatapathUser}
	func() {
		c, err := New(config)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(config); err == nil {
			t.Fatal("a second communicator got the same UDP port")
		}
		_ = c.Barrier()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		c, err := New(config)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leaked communicator still holds port %d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wordsOf splits text as the word-count example does.
func wordsOf(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	})
}

func TestKVWordCountMatchesAMap(t *testing.T) {
	texts := []string{
		"the quick brown fox jumps over the lazy dog",
		"The dog barks; the fox runs. A fox is quick!",
		strings.Repeat("lorem ipsum dolor sit amet ", 3000),
	}
	want := map[string]int64{}
	for _, text := range texts {
		for _, w := range wordsOf(text) {
			want[w]++
		}
	}
	comms := group(t, 3)
	results := make([]*KVResult, 3)
	onEvery(t, comms, func(c *Comm) error {
		kv, err := c.KVBegin(KVConfig{})
		if err != nil {
			return err
		}
		for _, w := range wordsOf(texts[c.Rank()]) {
			if err := kv.Emit([]byte(w), 1); err != nil {
				return err
			}
		}
		if err := kv.EmitFloat64([]byte("x"), 1); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("a float64 into an int64 reduce: %v", err)
		}
		if err := kv.Emit(nil, 1); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("an empty key: %v", err)
		}
		if err := kv.Emit(make([]byte, 65), 1); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("a key of 65 bytes: %v", err)
		}
		if _, err := c.KVBegin(KVConfig{}); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("a second KVBegin: %v", err)
		}
		res, err := kv.Finish()
		if err != nil {
			return err
		}
		if _, err := kv.Finish(); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("a second Finish: %v", err)
		}
		if err := kv.Emit([]byte("late"), 1); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("Emit after Finish: %v", err)
		}
		results[c.Rank()] = res
		return nil
	})
	got := map[string]int64{}
	var emitted uint64
	for r, res := range results {
		prev := ""
		for k, v := range res.All() {
			if _, dup := got[k]; dup {
				t.Fatalf("%q owned twice", k)
			}
			if k <= prev {
				t.Fatalf("rank %d: keys not sorted: %q after %q", r, k, prev)
			}
			prev = k
			got[k] = v.Int64()
		}
		emitted += res.Stats().PairsEmitted
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	var total int64
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("%q: %d, want %d", k, got[k], n)
		}
		total += n
	}
	if emitted != uint64(total) {
		t.Fatalf("%d pairs emitted, want %d", emitted, total)
	}
}

func TestKVFloatMinAndUintMax(t *testing.T) {
	comms := group(t, 2)
	onEvery(t, comms, func(c *Comm) error {
		kv, err := c.KVBegin(KVConfig{Type: Float64, Op: OpMin, KeyMax: 32})
		if err != nil {
			return err
		}
		for k := range 100 {
			if err := kv.EmitFloat64(fmt.Appendf(nil, "k%d", k), float64(k*(c.Rank()+1))-0.5); err != nil {
				return err
			}
		}
		res, err := kv.Finish()
		if err != nil {
			return err
		}
		for i := range res.Len() {
			var k int
			fmt.Sscanf(res.Key(i), "k%d", &k)
			if want := float64(k) - 0.5; res.Value(i).Float64() != want {
				return fmt.Errorf("%s: %v, want %v", res.Key(i), res.Value(i), want)
			}
		}
		kv, err = c.KVBegin(KVConfig{Type: Uint64, Op: OpMax, NoCombine: true})
		if err != nil {
			return err
		}
		if err := kv.EmitUint64([]byte("big"), math.MaxUint64-uint64(c.Rank())); err != nil {
			return err
		}
		res, err = kv.Finish()
		if err != nil {
			return err
		}
		if v, ok := res.Map()["big"]; ok && v.Uint64() != math.MaxUint64 {
			return fmt.Errorf("big: %v", v)
		}
		return nil
	})
}

func TestCloseEndsAnOpenKV(t *testing.T) {
	c, err := New(Config{MasterPort: freePort(t), Datapath: DatapathUser})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.KVBegin(KVConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Emit([]byte("a"), 1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := kv.Finish(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Finish after Close: %v", err)
	}
}

func TestAgreeWithinEpsilon(t *testing.T) {
	comms := group(t, 3)
	dir := t.TempDir()
	inputs := []float64{0, 500, 1000}
	got := make([]float64, 3)
	onEvery(t, comms, func(c *Comm) error {
		v, err := c.Agree(inputs[c.Rank()], AgreeConfig{
			Epsilon:   1e-3,
			F:         1,
			StorePath: filepath.Join(dir, fmt.Sprintf("rank%d", c.Rank())),
			Lo:        0,
			Hi:        1000,
			Linger:    200 * time.Millisecond,
		})
		got[c.Rank()] = v
		return err
	})
	for r, v := range got {
		if v < 0 || v > 1000 {
			t.Fatalf("rank %d: %v outside the inputs' range", r, v)
		}
		for _, w := range got {
			if math.Abs(v-w) > 1e-3 {
				t.Fatalf("values %v are not within 1e-3", got)
			}
		}
	}
	if _, err := comms[0].Agree(1, AgreeConfig{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no store path: %v", err)
	}
}

// Config.Store = StoreExternal joins an `aggbox store` (AGGBOX_BIN, the
// aggbox command, runs one) without any environment variable.
func TestExternalStoreThroughTheConfig(t *testing.T) {
	bin := os.Getenv("AGGBOX_BIN")
	if bin == "" {
		t.Skip("AGGBOX_BIN (the aggbox command) is not set")
	}
	port := freePort(t)
	store := exec.Command(bin, "store", "--world-size", "2", "--addr", "127.0.0.1", "--port", fmt.Sprint(port))
	out, err := store.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		store.Process.Kill()
		store.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "store for 2 ranks") {
		t.Fatalf("aggbox store said %q, %v", line, err)
	}
	comms := groupWith(t, 2, Config{MasterPort: port, Store: StoreExternal})
	onEvery(t, comms, func(c *Comm) error { return c.Barrier() })
}

func TestStatusStrings(t *testing.T) {
	if StatusPeerFailed.String() != "a peer failed" || Status(99).String() != "unknown status" {
		t.Fatalf("%q %q", StatusPeerFailed, Status(99))
	}
	if ErrTimeout.Error() != "aggbox: timed out" {
		t.Fatal(ErrTimeout.Error())
	}
	if errors.Is(ErrTimeout, ErrPeerFailed) {
		t.Fatal("sentinels differ")
	}
}
