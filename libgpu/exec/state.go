package exec

import (
	"reflect"
	"sync"
)

// states holds a backend's family state: one value per Go type, made on
// first use.
type states struct {
	mu sync.Mutex
	m  map[reflect.Type]any
	// order is the creation order (Close frees in reverse).
	order []any
}

// backend is a Host or a CUDA backend.
type backend interface {
	stateMap() *states
}

func (s *states) stateMap() *states { return s }

// StateOf returns b's value of type T, a zero T made on b's first call for
// that type: an op family keeps there what it caches per engine (a
// kernel-path probe, a tuned GEMM's algorithms, a solver's fallback), so
// the runtime holds no family's fields. Safe for concurrent use. On the
// CUDA backend a *T that implements Closer is closed by Engine.Close,
// inside Do and before the stream goes, in the reverse order of creation.
func StateOf[T any](b backend) *T {
	s := b.stateMap()
	s.mu.Lock()
	defer s.mu.Unlock()
	k := reflect.TypeFor[T]()
	if v, ok := s.m[k]; ok {
		return v.(*T)
	}
	if s.m == nil {
		s.m = map[reflect.Type]any{}
	}
	v := new(T)
	s.m[k] = v
	s.order = append(s.order, v)
	return v
}

// Closer is implemented by family state that holds CUDA resources.
type Closer interface {
	// Close frees the state's resources; c's context is current.
	Close(c *CUDA) error
}

// closeStates closes the CUDA backend's closable states, newest first.
func (s *states) closeStates(c *CUDA, keep func(error)) {
	s.mu.Lock()
	order := s.order
	s.m, s.order = nil, nil
	s.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		if cl, ok := order[i].(Closer); ok {
			keep(cl.Close(c))
		}
	}
}
