package app

// The trainer's models: each registers itself with the run driver from its
// own package (internal/driver.Register). A new model is its package and
// one line here.
import (
	_ "gpukit/trainer/internal/models/gpt"
	_ "gpukit/trainer/internal/models/hrm"
	_ "gpukit/trainer/internal/models/mlp"
	_ "gpukit/trainer/internal/models/moe"
	_ "gpukit/trainer/internal/models/unet"
)
