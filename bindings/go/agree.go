package aggbox

// #include "aggbox_go.h"
import "C"

import (
	"math"
	"strings"
	"time"
	"unsafe"
)

// AgreeConfig is what an agreement is asked to do; every rank passes the
// same Epsilon, F, Lo and Hi. The zero value of a field means the
// library's default.
type AgreeConfig struct {
	// Epsilon: every returned value lies within Epsilon of every other;
	// 0 means 1e-6.
	Epsilon float64
	// F is the number of ranks that may crash forever; the group must
	// have at least 2F+1 ranks.
	F int
	// Timeout of each phase; 0 means the communicator's.
	Timeout time.Duration
	// StorePath is this rank's persistent store, a file (one per rank and
	// agreement, in a directory that exists). Required.
	StorePath string
	// Lo and Hi bound every rank's input; the number of phases follows
	// from (Hi-Lo)/Epsilon. Both 0 means every finite float64 (about 1045
	// phases at 1e-6), so pass the bounds you know.
	Lo, Hi float64
	// Linger is how long a rank that decided keeps answering ranks that
	// lag behind; 0 means 1 s.
	Linger time.Duration
}

// Agree runs approximate agreement (a collective): every rank passes its
// input and gets a value within the range of the inputs and within
// Epsilon of the value every other rank gets, while up to F ranks crash
// forever and the others may crash and be started again (with the same
// rank, address, port and store, through a StoreExternal rendezvous).
func (c *Comm) Agree(value float64, config AgreeConfig) (float64, error) {
	const name = "aggbox_agree"
	var cfg C.aggbox_agree_config
	C.aggbox_agree_config_init(&cfg)
	if config.Epsilon != 0 {
		cfg.epsilon = C.double(config.Epsilon)
	}
	if config.F < 0 || config.F > math.MaxUint32 {
		return 0, invalid("%s: AgreeConfig.F is %d, below 0", name, config.F)
	}
	cfg.f = C.uint32_t(config.F)
	ms := func(d time.Duration, field string) (C.uint32_t, error) {
		if d < 0 || d.Milliseconds() > math.MaxUint32 {
			return 0, invalid("%s: AgreeConfig.%s is %v, not between 0 and 2^32 ms", name, field, d)
		}
		return C.uint32_t(d.Milliseconds()), nil
	}
	var err error
	if cfg.timeout_ms, err = ms(config.Timeout, "Timeout"); err != nil {
		return 0, err
	}
	if config.Linger != 0 {
		if cfg.linger_ms, err = ms(config.Linger, "Linger"); err != nil {
			return 0, err
		}
	}
	if config.Lo != 0 || config.Hi != 0 {
		cfg.lo, cfg.hi = C.double(config.Lo), C.double(config.Hi)
	}
	if config.StorePath == "" {
		return 0, invalid("%s: AgreeConfig.StorePath is required", name)
	}
	if strings.IndexByte(config.StorePath, 0) >= 0 {
		return 0, invalid("%s: AgreeConfig.StorePath holds a NUL byte", name)
	}
	path := C.CString(config.StorePath)
	defer C.free(unsafe.Pointer(path))
	cfg.store_path = path
	h, err := c.lock(name)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	v := C.double(value)
	if err := check(C.agg_agree(h, &cfg, &v)); err != nil {
		return 0, err
	}
	return float64(v), nil
}
