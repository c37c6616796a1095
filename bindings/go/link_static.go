//go:build aggbox_static

package aggbox

// Links libaggbox.a and what the Rust runtime in it needs from the system,
// as aggbox-static.pc describes them: the program needs no libaggbox.so
// at run time.

// #cgo pkg-config: aggbox-static
import "C"
