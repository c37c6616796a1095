// Command paramavg is a parameter-averaging worker (local SGD): every rank
// trains its own copy of a parameter vector on its own gradients and,
// every few steps, the ranks average their copies with one allreduce.
//
//	RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 ./paramavg [-params N] [-steps S] [-sync K] [-lr LR]
//
// The gradients are a made-up deterministic function of the rank, the step
// and the index (a real worker would compute them from its data), so that a
// test can recompute the training in a plain loop. It prints one line:
//
//	rank=R size=N datapath=D params=P steps=S syncs=Y sum=SUM p0=X plast=Y us_per_sync=T
//
// where sum is the sum of the final parameters, p0 and plast the first and
// last; every rank prints the same values (the average is bit for bit the
// same everywhere). On an error it prints it on stderr and exits with 1.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	aggbox "github.com/aggbox/aggbox/bindings/go"
)

// Grad is rank r's made-up gradient of parameter i at step t: small
// integers, the same in the test's reference loop.
func Grad(r, t, i int) float32 {
	return float32((r+1)*(i%7+1)*(t+1)%13 - 6)
}

func main() {
	params := flag.Int("params", 100000, "number of parameters")
	steps := flag.Int("steps", 20, "local steps")
	syncEvery := flag.Int("sync", 5, "average the parameters every this many steps (and after the last)")
	lr := flag.Float64("lr", 0.125, "learning rate")
	flag.Parse()
	if *params < 1 || *steps < 1 || *syncEvery < 1 {
		fmt.Fprintln(os.Stderr, "paramavg: -params, -steps and -sync must be at least 1")
		os.Exit(2)
	}

	comm, err := aggbox.NewFromEnv()
	if err != nil {
		fail(err)
	}
	defer comm.Close()

	// Every rank starts from rank 0's parameters.
	p := make([]float32, *params)
	if comm.Rank() == 0 {
		for i := range p {
			p[i] = float32(i%100) / 4
		}
	}
	if err := aggbox.Broadcast(comm, p, 0); err != nil {
		fail(err)
	}

	syncs := 0
	var spent time.Duration
	for t := range *steps {
		for i := range p {
			p[i] -= float32(*lr) * Grad(comm.Rank(), t, i)
		}
		if (t+1)%*syncEvery == 0 || t == *steps-1 {
			start := time.Now()
			if err := aggbox.Allreduce(comm, p, p, aggbox.OpAvg); err != nil {
				fail(err)
			}
			spent += time.Since(start)
			syncs++
		}
	}

	var sum float64
	for _, x := range p {
		sum += float64(x)
	}
	datapath, _ := comm.Datapath()
	fmt.Printf("rank=%d size=%d datapath=%v params=%d steps=%d syncs=%d sum=%.6f p0=%.6f plast=%.6f us_per_sync=%.1f\n",
		comm.Rank(), comm.Size(), datapath, len(p), *steps, syncs, sum, p[0], p[len(p)-1],
		float64(spent.Microseconds())/float64(syncs))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "paramavg:", err)
	os.Exit(1)
}
