package driver

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"gpukit/libgpu/ops"
)

// ErrConfig marks an unusable configuration or flag value: the trainer
// exits 2 (usage) with the error's message, which names the bad setting.
var ErrConfig = errors.New("invalid configuration")

// ErrCheckpoint reports a checkpoint that cannot be used.
var ErrCheckpoint = errors.New("unusable checkpoint")

// configError is a configuration error whose message is the bad setting
// alone ("--lr 0 (want 0 < lr ≤ 10)"), not prefixed by ErrConfig's text.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrConfig }

// Configf returns an ErrConfig error with the formatted message (one
// setting and what it must be, as flags name it).
func Configf(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...)}
}

// Round rounds v to digits decimals (JSON lines' timings).
func Round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}

// RoundSig rounds v to digits significant decimal digits (MFU: the first
// interval includes kernel compilation and graph capture, and its MFU is
// tiny but not zero).
func RoundSig(v float64, digits int) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', digits, 64), 64)
	return r
}

// Join is a buffer name under the run's prefix: "run/name", or name
// alone when run is empty.
func Join(run, name string) string {
	if run == "" {
		return name
	}
	return run + "/" + name
}

// PrecisionName is the --precision value of p.
func PrecisionName(p ops.Precision) string {
	switch p {
	case ops.PrecF32:
		return "f32"
	case ops.PrecTF32:
		return "tf32"
	case ops.PrecBF16:
		return "bf16"
	}
	return fmt.Sprintf("precision(%d)", p)
}
