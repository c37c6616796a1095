// Package aggbox is the Go binding of AggBox: broadcast and aggregation
// collectives (allreduce, reduce, reduce-scatter, allgather, key-value
// reduce, approximate agreement) between the processes of a distributed
// job, with the hot part done inside the Linux kernel by eBPF, or by the
// same protocol in user space.
//
// It calls the C library libaggbox through cgo, found with pkg-config
// (aggbox.pc, installed by scripts/install.sh); build with
// -tags aggbox_static to link libaggbox.a instead.
//
// A program joins a group with [New] or [NewFromEnv] (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and AGGBOX_* as for the C library), runs
// collectives on the [Comm] it gets, in the same order on every rank, and
// closes it:
//
//	comm, err := aggbox.NewFromEnv()
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer comm.Close()
//	grad := make([]float32, 1<<20)
//	err = aggbox.Allreduce(comm, grad, grad, aggbox.OpAvg) // in place
//
// Errors are *[Error] values carrying the library's status and message
// (which names the failed rank when a peer failed); [errors.Is] matches
// them against [ErrPeerFailed], [ErrTimeout], [ErrInvalidArgument] and the
// other sentinels. Bad arguments (mismatched lengths, a root that is not a
// rank, a closed communicator) are errors, never panics.
//
// A Comm may be used from several goroutines: its calls are serialised
// (each waits for the one in progress). Close is idempotent, and a Comm
// that is never closed is closed when it is garbage collected.
package aggbox
