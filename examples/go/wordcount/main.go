// Command wordcount is a MapReduce word count over files with AggBox's
// key-value reduce.
//
//	RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 ./wordcount [-all] FILE...
//
// Every rank reads the files whose position on the command line, mod
// WORLD_SIZE, is its rank, splits them into words (runs of ASCII letters
// and digits, lower-cased, at most 64 bytes; longer runs are skipped) and
// emits each with the value 1; Finish gives each rank the counts of the
// words it owns. It prints
//
//	rank=R size=N datapath=D words=W owned=K top=WORD:COUNT,WORD:COUNT,WORD:COUNT
//
// and with -all one line "pair WORD COUNT" per word it owns. On an error it
// prints it on stderr and exits with 1.
package main

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	aggbox "github.com/aggbox/aggbox/bindings/go"
)

const keyMax = 64

func isWordByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

func main() {
	all := flag.Bool("all", false, "print every owned word and its count")
	flag.Parse()

	comm, err := aggbox.NewFromEnv()
	if err != nil {
		fail(err)
	}
	defer comm.Close()

	kv, err := comm.KVBegin(aggbox.KVConfig{KeyMax: keyMax, Type: aggbox.Int64, Op: aggbox.OpSum})
	if err != nil {
		fail(err)
	}
	words := 0
	for i, name := range flag.Args() {
		if i%comm.Size() != comm.Rank() {
			continue
		}
		text, err := os.ReadFile(name)
		if err != nil {
			fail(err)
		}
		for _, word := range bytes.FieldsFunc(text, func(r rune) bool { return r > 0x7f || !isWordByte(byte(r)) }) {
			if len(word) > keyMax {
				continue
			}
			if err := kv.Emit(bytes.ToLower(word), 1); err != nil {
				fail(err)
			}
			words++
		}
	}
	result, err := kv.Finish()
	if err != nil {
		fail(err)
	}

	type pair struct {
		word  string
		count int64
	}
	var owned []pair
	for word, count := range result.All() {
		owned = append(owned, pair{word, count.Int64()})
	}
	top := slices.Clone(owned)
	slices.SortStableFunc(top, func(a, b pair) int { return cmp.Compare(b.count, a.count) })
	var tops []string
	for _, p := range top[:min(3, len(top))] {
		tops = append(tops, fmt.Sprintf("%s:%d", p.word, p.count))
	}
	datapath, _ := comm.Datapath()
	fmt.Printf("rank=%d size=%d datapath=%v words=%d owned=%d top=%s\n",
		comm.Rank(), comm.Size(), datapath, words, len(owned), strings.Join(tops, ","))
	if *all {
		for _, p := range owned {
			fmt.Printf("pair %s %d\n", p.word, p.count)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wordcount:", err)
	os.Exit(1)
}
