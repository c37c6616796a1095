package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Status is the status of a call of the C library (aggbox_status).
type Status int

// The statuses; their values are those of the C library's aggbox_status.
const (
	StatusOK              Status = C.AGGBOX_OK
	StatusInvalidArgument Status = C.AGGBOX_ERR_INVALID_ARGUMENT
	StatusTimeout         Status = C.AGGBOX_ERR_TIMEOUT
	StatusPeerFailed      Status = C.AGGBOX_ERR_PEER_FAILED
	StatusSystem          Status = C.AGGBOX_ERR_SYSTEM
	StatusUnsupported     Status = C.AGGBOX_ERR_UNSUPPORTED
	StatusInternal        Status = C.AGGBOX_ERR_INTERNAL
)

// String is the library's description of s ("timed out", "a peer
// failed", ...).
func (s Status) String() string {
	if s < 0 || s > 1<<20 {
		return fmt.Sprintf("unknown status %d", int(s))
	}
	return C.GoString(C.aggbox_status_string(C.aggbox_status(s)))
}

// Error is a failed call: its status and the message saying what failed
// and where, such as "aggbox_barrier: rank 3 failed: ...".
type Error struct {
	Status  Status
	Message string
	cause   error
}

// Error is the message, or the status when there is none.
func (e *Error) Error() string {
	if e.Message == "" {
		return "aggbox: " + e.Status.String()
	}
	return e.Message
}

// Is makes errors.Is(err, ErrPeerFailed) (and the other sentinels) true
// for every error of that status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.cause == nil && t.Status == e.Status
}

// Unwrap gives the cause of an error made by this package rather than by
// the library, such as [ErrClosed].
func (e *Error) Unwrap() error { return e.cause }

// Sentinel errors, one per status: errors.Is(err, ErrTimeout) is true when
// err is an *Error of status StatusTimeout.
var (
	// ErrInvalidArgument: something unusable was passed (nothing was
	// sent), or the ranks' calls of a collective disagree ("mismatched
	// collective calls").
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	// ErrTimeout: an operation did not complete within the timeout and no
	// peer is to blame.
	ErrTimeout = &Error{Status: StatusTimeout}
	// ErrPeerFailed: a peer did not answer within the timeout or broke the
	// protocol; the message names its rank.
	ErrPeerFailed = &Error{Status: StatusPeerFailed}
	// ErrSystem: a system call failed; the message says which and why.
	ErrSystem = &Error{Status: StatusSystem}
	// ErrUnsupported: this host cannot do what was asked (such as the
	// kernel datapath without CAP_BPF); the message says how to fix it.
	ErrUnsupported = &Error{Status: StatusUnsupported}
	// ErrInternal: a bug in AggBox; close the communicator.
	ErrInternal = &Error{Status: StatusInternal}
)

// ErrClosed is the cause of the error of a call on a closed [Comm] (or a
// finished [KV]); that error is also an [ErrInvalidArgument].
var ErrClosed = errors.New("aggbox: closed")

// check turns the result of a helper of aggbox_go.h into an error, and
// frees its message.
func check(r C.agg_res) error {
	if r.status == C.AGGBOX_OK {
		return nil
	}
	msg := "out of memory reading the error message"
	if r.msg != nil {
		msg = C.GoString(r.msg)
		C.free(unsafe.Pointer(r.msg))
	}
	return &Error{Status: Status(r.status), Message: msg}
}

// invalid is an error of this package's own argument checks.
func invalid(format string, args ...any) error {
	return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// closed is the error of a call named op on something closed.
func closed(op, what string) error {
	return &Error{Status: StatusInvalidArgument, Message: op + ": the " + what + " is closed", cause: ErrClosed}
}
