// Package opstest is test support for ops backends: float64 reference
// implementations of every op (written from the formulas in package ops,
// independently of any backend), numerical helpers (relative error, random
// fill, central finite differences, NaN poisoning) and CheckImpl, the suite
// that runs every op through an ops.Engine on a given device and compares it
// with the references. The host backend's tests and the CUDA backend's tests
// both call CheckImpl; it moves data only through tensor.Write/Read, so it
// works on any device.
package opstest
