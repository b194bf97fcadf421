package chrome

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
)

// ErrInvalid is a trace that breaks a rule Validate checks.
var ErrInvalid = errors.New("chrome: invalid trace")

// Event is one trace event as read back. Times are microseconds.
type Event struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Pid  uint32         `json:"pid"`
	Tid  uint32         `json:"tid"`
	ID   uint64         `json:"id"`
	Bp   string         `json:"bp"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

// End is Ts+Dur.
func (e *Event) End() float64 { return e.Ts + e.Dur }

// Trace is a parsed trace file.
type Trace struct {
	Events []Event
	// Processes and Threads are the names from M events.
	Processes map[uint32]string
	Threads   map[[2]uint32]string
}

// ReadFile parses a trace file in the object format ({"traceEvents":[...]})
// or the array format ([...]).
func ReadFile(path string) (*Trace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chrome: %w", err)
	}
	return Parse(b)
}

// Parse parses trace JSON and checks that every event has ph, ts, pid, tid
// and name (errors wrap ErrInvalid).
func Parse(b []byte) (*Trace, error) {
	var raw []json.RawMessage
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		if err := json.Unmarshal(t, &raw); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	} else {
		var obj struct {
			TraceEvents []json.RawMessage `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		if obj.TraceEvents == nil {
			return nil, fmt.Errorf("%w: no traceEvents", ErrInvalid)
		}
		raw = obj.TraceEvents
	}
	tr := &Trace{Events: make([]Event, len(raw)), Processes: map[uint32]string{}, Threads: map[[2]uint32]string{}}
	for i, r := range raw {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(r, &keys); err != nil {
			return nil, fmt.Errorf("%w: event %d: %v", ErrInvalid, i, err)
		}
		for _, k := range []string{"ph", "ts", "pid", "tid", "name"} {
			if _, ok := keys[k]; !ok {
				return nil, fmt.Errorf("%w: event %d has no %q: %s", ErrInvalid, i, k, r)
			}
		}
		e := &tr.Events[i]
		if err := json.Unmarshal(r, e); err != nil {
			return nil, fmt.Errorf("%w: event %d: %v", ErrInvalid, i, err)
		}
		if e.Ph == "M" {
			name, _ := e.Args["name"].(string)
			switch e.Name {
			case "process_name":
				tr.Processes[e.Pid] = name
			case "thread_name":
				tr.Threads[[2]uint32{e.Pid, e.Tid}] = name
			}
		}
	}
	return tr, nil
}

// Summary is what Validate found.
type Summary struct {
	Events    int // all events
	Processes int // processes with events other than M
	Flows     int // s/f pairs
	// CrossFlows are flows whose ends lie in two processes.
	CrossFlows int
	// LinkedProcesses is the number of processes at an end of a cross-process flow.
	LinkedProcesses int
}

// Validate checks the rules of a file tracer writes: durations are finite
// and non-negative, timestamps finite; every flow id has exactly one "s"
// and one "f", the "f" with "bp":"e"; every process with events has a
// process_name and every thread with events a thread_name.
func (tr *Trace) Validate() (Summary, error) {
	s := Summary{Events: len(tr.Events)}
	type ends struct{ s, f []*Event }
	flows := map[uint64]*ends{}
	pids := map[uint32]bool{}
	for i := range tr.Events {
		e := &tr.Events[i]
		if math.IsNaN(e.Ts) || math.IsInf(e.Ts, 0) || math.IsNaN(e.Dur) || math.IsInf(e.Dur, 0) {
			return s, fmt.Errorf("%w: event %d (%s) has a non-finite time", ErrInvalid, i, e.Name)
		}
		switch e.Ph {
		case "M":
			continue
		case "X":
			if e.Dur < 0 {
				return s, fmt.Errorf("%w: event %d (%s) has duration %g", ErrInvalid, i, e.Name, e.Dur)
			}
		case "s", "f":
			fl := flows[e.ID]
			if fl == nil {
				fl = &ends{}
				flows[e.ID] = fl
			}
			if e.Ph == "s" {
				fl.s = append(fl.s, e)
			} else {
				if e.Bp != "e" {
					return s, fmt.Errorf("%w: flow finish %d without \"bp\":\"e\"", ErrInvalid, e.ID)
				}
				fl.f = append(fl.f, e)
			}
		case "i", "C":
		default:
			return s, fmt.Errorf("%w: event %d has phase %q", ErrInvalid, i, e.Ph)
		}
		pids[e.Pid] = true
		if _, ok := tr.Processes[e.Pid]; !ok {
			return s, fmt.Errorf("%w: process %d has no process_name", ErrInvalid, e.Pid)
		}
		if e.Ph != "C" {
			if _, ok := tr.Threads[[2]uint32{e.Pid, e.Tid}]; !ok {
				return s, fmt.Errorf("%w: thread %d of process %d has no thread_name", ErrInvalid, e.Tid, e.Pid)
			}
		}
	}
	linked := map[uint32]bool{}
	for id, fl := range flows {
		if len(fl.s) != 1 || len(fl.f) != 1 {
			return s, fmt.Errorf("%w: flow %d has %d starts and %d finishes", ErrInvalid, id, len(fl.s), len(fl.f))
		}
		s.Flows++
		if fl.s[0].Pid != fl.f[0].Pid {
			s.CrossFlows++
			linked[fl.s[0].Pid], linked[fl.f[0].Pid] = true, true
		}
	}
	s.Processes = len(pids)
	s.LinkedProcesses = len(linked)
	return s, nil
}
