//go:build !aggbox_static

package aggbox

// Links libaggbox.so as pkg-config describes it (scripts/install.sh
// installs aggbox.pc). Build with -tags aggbox_static to link libaggbox.a.

// #cgo pkg-config: aggbox
import "C"
