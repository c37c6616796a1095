package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Request is an asynchronous operation started by IAllreduce or
// IBroadcast. Wait for it or Test it from any goroutine; its buffers stay
// pinned until it has finished. It stays valid after its communicator is
// closed. A request that is dropped unfinished is waited for and freed
// when it is garbage collected.
type Request struct {
	mu      sync.Mutex
	state   *requestState
	done    bool
	err     error
	cleanup runtime.Cleanup
}

// requestState is what the cleanup of a leaked Request frees.
type requestState struct {
	h      *C.aggbox_request
	pinner runtime.Pinner
}

func (s *requestState) free() {
	if s.h != nil {
		C.aggbox_request_free(s.h) // waits for the operation
		s.h = nil
	}
	s.pinner.Unpin()
}

// newRequest pins the buffers an operation is about to be given.
func newRequest(buffers ...unsafe.Pointer) *Request {
	r := &Request{state: &requestState{}}
	for _, b := range buffers {
		if b != nil {
			r.state.pinner.Pin(b)
		}
	}
	return r
}

// started finishes making r once the library was asked to start it.
func (r *Request) started(h *C.aggbox_request, err error) (*Request, error) {
	r.state.h = h
	if err != nil {
		r.state.free()
		return nil, err
	}
	r.cleanup = runtime.AddCleanup(r, (*requestState).free, r.state)
	return r, nil
}

// finish records the outcome and releases the buffers.
func (r *Request) finish(err error) error {
	r.done, r.err = true, err
	r.state.free()
	r.cleanup.Stop()
	return err
}

// Wait blocks until the operation has finished and returns its error
// (nil on success). Waiting again returns the same.
func (r *Request) Wait() error {
	if r == nil {
		return invalid("aggbox_wait: the request is nil")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return r.err
	}
	return r.finish(check(C.agg_wait(r.state.h)))
}

// Test tells, without waiting, whether the operation has finished, and
// then its error.
func (r *Request) Test() (bool, error) {
	if r == nil {
		return false, invalid("aggbox_test: the request is nil")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return true, r.err
	}
	var done C.int
	err := check(C.agg_test(r.state.h, &done))
	if done == 0 && err == nil {
		return false, nil
	}
	return true, r.finish(err)
}
