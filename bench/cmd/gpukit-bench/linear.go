package main

// linear is filled in once the CUDA ops backend lands.
func (b *bench) linear(w Workload) (Result, error) { return Result{}, errSkip }
