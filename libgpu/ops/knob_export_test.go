package ops

// setVar sets the package knob *p to v and returns a func that restores
// its previous value: the body of the Set* functions tests and benchmarks
// use to choose a path.
func setVar[T any](p *T, v T) (restore func()) {
	old := *p
	*p = v
	return func() { *p = old }
}
