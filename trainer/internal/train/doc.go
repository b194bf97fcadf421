// Package train owns the trainer's training and evaluation loops: building a
// model and optimizer from a Config, feeding Fashion-MNIST batches in a
// seeded order, logging JSON lines, writing checkpoints that resume exactly,
// and the loss plot. It knows nothing of flags (internal/app parses them).
package train
