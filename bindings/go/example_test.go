package aggbox_test

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	aggbox "github.com/aggbox/aggbox/bindings/go"
)

// Each example runs as a group of one rank on loopback, so that it runs
// anywhere; in a job every rank runs the same code, with its own Rank.

func ExampleNew() {
	comm, err := aggbox.New(aggbox.Config{
		Rank:       0,
		WorldSize:  1,
		MasterAddr: "127.0.0.1",
		MasterPort: 29581,
		Datapath:   aggbox.DatapathUser,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	datapath, _ := comm.Datapath()
	fmt.Println("rank", comm.Rank(), "of", comm.Size(), "on the", datapath, "datapath")
	// Output: rank 0 of 1 on the user datapath
}

func ExampleNewFromEnv() {
	// RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 AGGBOX_DATAPATH=kernel ./worker
	comm, err := aggbox.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	if err := comm.Barrier(); errors.Is(err, aggbox.ErrPeerFailed) {
		log.Fatal("a rank is gone: ", err) // the message names it
	}
}

func ExampleAllreduce() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29582, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	grad := []float32{0.5, -1, 2}
	// Averaged over every rank, in place: every rank gets the same result.
	if err := aggbox.Allreduce(comm, grad, grad, aggbox.OpAvg); err != nil {
		log.Fatal(err)
	}
	fmt.Println(grad)
	// Output: [0.5 -1 2]
}

func ExampleBroadcast() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29583, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	params := make([]float64, 4)
	if comm.Rank() == 0 {
		copy(params, []float64{1, 2, 3, 4})
	}
	if err := aggbox.Broadcast(comm, params, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(params)
	// Output: [1 2 3 4]
}

func ExampleIAllreduce() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29584, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	counts := []int64{3, 1, 4}
	total := make([]int64, len(counts))
	req, err := aggbox.IAllreduce(comm, counts, total, aggbox.OpSum)
	if err != nil {
		log.Fatal(err)
	}
	// ... work that touches neither slice ...
	if err := req.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(total)
	// Output: [3 1 4]
}

func ExampleComm_KVBegin() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29585, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	kv, err := comm.KVBegin(aggbox.KVConfig{Type: aggbox.Int64, Op: aggbox.OpSum})
	if err != nil {
		log.Fatal(err)
	}
	for _, word := range []string{"to", "be", "or", "not", "to", "be"} {
		if err := kv.Emit([]byte(word), 1); err != nil {
			log.Fatal(err)
		}
	}
	result, err := kv.Finish()
	if err != nil {
		log.Fatal(err)
	}
	// This rank's keys (with one rank, every key), sorted.
	for word, count := range result.All() {
		fmt.Println(word, count.Int64())
	}
	// Output:
	// be 2
	// not 1
	// or 1
	// to 2
}

func ExampleComm_Agree() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29586, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	dir, err := os.MkdirTemp("", "agree")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	v, err := comm.Agree(42, aggbox.AgreeConfig{
		Epsilon:   1e-6,
		StorePath: filepath.Join(dir, "rank0"),
		Lo:        0,
		Hi:        100,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(v)
	// Output: 42
}

func ExampleError() {
	comm, err := aggbox.New(aggbox.Config{MasterPort: 29587, Datapath: aggbox.DatapathUser})
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	err = aggbox.Allreduce(comm, make([]int32, 3), make([]int32, 4), aggbox.OpSum)
	var e *aggbox.Error
	if errors.As(err, &e) && errors.Is(err, aggbox.ErrInvalidArgument) {
		fmt.Println(e.Status, "|", e.Message)
	}
	// Output: invalid argument | aggbox_allreduce: send has 3 elements, recv 4: they must have the same length
}
