package ipc

import (
	"errors"
	"strings"
	"sync"
	"unicode/utf8"
)

// Errors of the protocol itself. Each has a wire code (PROTOCOL.md, "Errors").
var (
	ErrMalformed   = errors.New("ipc: malformed message")
	ErrTooLarge    = errors.New("ipc: message too large")
	ErrTooManyFDs  = errors.New("ipc: too many file descriptors")
	ErrVersion     = errors.New("ipc: protocol version mismatch")
	ErrUnknownOp   = errors.New("ipc: unknown op")
	ErrBadRequest  = errors.New("ipc: bad request")
	ErrPermission  = errors.New("ipc: permission denied")
	ErrInternal    = errors.New("ipc: internal error")
	ErrClosed      = errors.New("ipc: connection closed")
	ErrSocketInUse = errors.New("ipc: socket in use by a live daemon")
	// ErrLimit is a refusal because a limit of the daemon was reached (its
	// message names the limit): connections, or what one connection may
	// hold. The request may succeed later; the connection stays open
	// unless the refusal was of the connection itself.
	ErrLimit = errors.New("ipc: limit reached")
	// ErrTimeout ends a connection whose peer did not answer a request
	// within the client's deadline.
	ErrTimeout = errors.New("ipc: no reply in time")
	// ErrUntrusted is a socket served by a uid the client does not trust
	// (see DialOptions): nothing was sent to it.
	ErrUntrusted = errors.New("ipc: socket served by an untrusted user")
	// ErrUnsafeSocket is a socket path whose directory others could
	// change (see ListenOptions): the daemon refuses to listen there.
	ErrUnsafeSocket = errors.New("ipc: unsafe socket directory")
)

// MaxErrorMessage is the longest error message sent, in bytes; ToWire cuts
// longer ones (so an error quoting a hostile request still fits a frame).
const MaxErrorMessage = 1024

var registry = struct {
	sync.RWMutex
	byCode map[string]error
	order  []string
}{byCode: map[string]error{}}

func init() {
	RegisterError("malformed", ErrMalformed)
	RegisterError("too_large", ErrTooLarge)
	RegisterError("too_many_fds", ErrTooManyFDs)
	RegisterError("version", ErrVersion)
	RegisterError("unknown_op", ErrUnknownOp)
	RegisterError("bad_request", ErrBadRequest)
	RegisterError("permission_denied", ErrPermission)
	RegisterError("internal", ErrInternal)
	RegisterError("limit", ErrLimit)
	RegisterError("timeout", ErrTimeout)
	RegisterError("untrusted", ErrUntrusted)
	RegisterError("unsafe_socket", ErrUnsafeSocket)
}

// RegisterError gives sentinel a wire code, so an error that wraps sentinel on
// one side of a socket comes back on the other side as a *RemoteError for
// which errors.Is(err, sentinel) holds. Packages call it from init, with codes
// prefixed by the package ("pool.no_such_name"). Registering a code twice
// keeps the first sentinel.
func RegisterError(code string, sentinel error) {
	registry.Lock()
	defer registry.Unlock()
	if _, ok := registry.byCode[code]; ok {
		return
	}
	registry.byCode[code] = sentinel
	registry.order = append(registry.order, code)
}

// ToWire returns the wire form of err: the code of the first registered
// sentinel it wraps (in registration order; "internal" when none) and its
// text, made valid UTF-8 (an error may quote a peer's bytes; a strict
// decoder on the other side could not read them) and cut to
// MaxErrorMessage bytes.
func ToWire(err error) *WireError {
	if err == nil {
		return nil
	}
	msg := Cut(strings.ToValidUTF8(err.Error(), "\uFFFD"), MaxErrorMessage)
	var re *RemoteError
	if errors.As(err, &re) {
		return &WireError{Code: re.Code, Message: msg}
	}
	registry.RLock()
	defer registry.RUnlock()
	for _, code := range registry.order {
		if errors.Is(err, registry.byCode[code]) {
			return &WireError{Code: code, Message: msg}
		}
	}
	return &WireError{Code: "internal", Message: msg}
}

// Cut returns s cut to at most n bytes at a UTF-8 character boundary, with
// "..." at the end when it was cut (n >= 3).
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	end := max(n-3, 0)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "..."
}

// RemoteError is an error received from the peer. errors.Is matches the
// sentinel registered for Code on this side.
type RemoteError struct {
	Code    string
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

// Unwrap returns the sentinel registered for e.Code, or nil.
func (e *RemoteError) Unwrap() error {
	registry.RLock()
	defer registry.RUnlock()
	return registry.byCode[e.Code]
}

// FromWire rebuilds an error received from the peer.
func FromWire(w *WireError) error {
	if w == nil {
		return nil
	}
	msg := w.Message
	if msg == "" {
		msg = "ipc: remote error " + w.Code
	}
	return &RemoteError{Code: w.Code, Message: msg}
}
