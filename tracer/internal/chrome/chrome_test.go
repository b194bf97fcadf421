package chrome

import (
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func randEvent(r *rand.Rand, i int) []byte {
	b := Head(nil, 'X', randString(r), "cat", r.Int64N(1<<50), r.Uint32(), r.Uint32())
	b = append(b, `,"dur":`...)
	b = AppendMicros(b, r.Int64N(1<<30))
	return append(b, '}')
}

func randString(r *rand.Rand) string {
	b := make([]byte, r.IntN(20))
	for i := range b {
		b[i] = byte(r.IntN(256)) // control bytes, quotes, invalid UTF-8 included
	}
	return string(b)
}

// TestWriterValidAfterEveryFlush: the file parses after every flush, holds
// exactly the events added, and Close leaves it valid too.
func TestWriterValidAfterEveryFlush(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	path := filepath.Join(t.TempDir(), "t.json")
	w, err := Create(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	check := func(want int) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := Parse(b)
		if err != nil {
			t.Fatalf("after %d events: %v\n%s", want, err, b)
		}
		if len(tr.Events) != want {
			t.Fatalf("%d events in file, want %d", len(tr.Events), want)
		}
	}
	check(0)
	n := 0
	for round := 0; round < 20; round++ {
		k := r.IntN(50)
		for i := 0; i < k; i++ {
			if !w.Add(randEvent(r, n)) {
				t.Fatal("refused without a cap")
			}
			n++
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		check(n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	check(n)
	if w.Close() != ErrClosed || w.Flush() != ErrClosed || w.Add([]byte("{}")) {
		t.Fatal("closed writer still works")
	}
}

// TestWriterSizeCap: the file never passes the cap, refused events are counted.
func TestWriterSizeCap(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	path := filepath.Join(t.TempDir(), "t.json")
	limit := int64(2000 + r.IntN(3000))
	w, err := Create(path, limit, 0)
	if err != nil {
		t.Fatal(err)
	}
	added := 0
	const total = 500
	for i := 0; i < total; i++ {
		if w.Add(randEvent(r, i)) {
			added++
		}
		if i%7 == 0 {
			w.Flush()
		}
	}
	w.Close()
	fi, _ := os.Stat(path)
	if fi.Size() > limit || w.Capped() != uint64(total-added) || added == 0 || added == total {
		t.Fatalf("size %d (cap %d), %d added, %d capped", fi.Size(), limit, added, w.Capped())
	}
	b, _ := os.ReadFile(path)
	if tr, err := Parse(b); err != nil || len(tr.Events) != added {
		t.Fatalf("%v", err)
	}
	if _, err := Create(path, 3, 0); err == nil {
		t.Fatal("a cap smaller than an empty trace was taken")
	}
}

// TestAppendString agrees with encoding/json on random bytes.
func TestAppendString(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for i := 0; i < 2000; i++ {
		s := randString(r)
		var back string
		if err := json.Unmarshal(AppendString(nil, s), &back); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		var want strings.Builder // each invalid byte becomes U+FFFD
		for j := 0; j < len(s); {
			c, size := utf8.DecodeRuneInString(s[j:])
			want.WriteRune(c)
			j += size
		}
		if back != want.String() {
			t.Fatalf("%q came back as %q", s, back)
		}
	}
}

func TestAppendMicros(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for i := 0; i < 1000; i++ {
		ns := r.Int64N(1<<62) - 1<<61
		var f json.Number
		if err := json.Unmarshal(AppendMicros(nil, ns), &f); err != nil {
			t.Fatal(err)
		}
		// Compare as exact decimals: µs·1000 must give back ns.
		s := f.String()
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		intPart, frac, _ := strings.Cut(s, ".")
		var got int64
		for _, c := range intPart + frac {
			got = got*10 + int64(c-'0')
		}
		if neg {
			got = -got
		}
		if got != ns {
			t.Fatalf("%d ns written as %s", ns, f)
		}
	}
}

func TestValidateRules(t *testing.T) {
	names := `{"ph":"M","name":"process_name","ts":0,"pid":1,"tid":1,"args":{"name":"a"}},
{"ph":"M","name":"thread_name","ts":0,"pid":1,"tid":1,"args":{"name":"main"}},
{"ph":"M","name":"process_name","ts":0,"pid":2,"tid":2,"args":{"name":"b"}},
{"ph":"M","name":"thread_name","ts":0,"pid":2,"tid":2,"args":{"name":"main"}}`
	good := `{"ph":"X","name":"x","ts":1,"dur":2,"pid":1,"tid":1},
{"ph":"X","name":"y","ts":2,"dur":2,"pid":2,"tid":2},
{"ph":"s","name":"m","cat":"flow","ts":1,"pid":1,"tid":1,"id":7},
{"ph":"f","name":"m","cat":"flow","ts":2,"pid":2,"tid":2,"id":7,"bp":"e"}`
	wrap := func(ev string) []byte { return []byte(`{"traceEvents":[` + names + ",\n" + ev + `]}`) }
	tr, err := Parse(wrap(good))
	if err != nil {
		t.Fatal(err)
	}
	s, err := tr.Validate()
	if err != nil || s.Flows != 1 || s.CrossFlows != 1 || s.LinkedProcesses != 2 || s.Processes != 2 {
		t.Fatalf("%+v %v", s, err)
	}
	bad := map[string]string{
		"negative dur":   `{"ph":"X","name":"x","ts":1,"dur":-2,"pid":1,"tid":1}`,
		"no pid":         `{"ph":"X","name":"x","ts":1,"dur":2,"tid":1}`,
		"no name":        `{"ph":"i","ts":1,"pid":1,"tid":1}`,
		"unnamed proc":   `{"ph":"X","name":"x","ts":1,"dur":2,"pid":3,"tid":3}`,
		"unnamed thread": `{"ph":"X","name":"x","ts":1,"dur":2,"pid":1,"tid":9}`,
		"lone start":     `{"ph":"s","name":"m","ts":1,"pid":1,"tid":1,"id":8}`,
		"finish no bp":   `{"ph":"s","name":"m","ts":1,"pid":1,"tid":1,"id":8},{"ph":"f","name":"m","ts":1,"pid":1,"tid":1,"id":8}`,
		"two starts":     good + `,{"ph":"s","name":"m","ts":1,"pid":1,"tid":1,"id":7}`,
		"bad phase":      `{"ph":"Q","name":"x","ts":1,"pid":1,"tid":1}`,
	}
	for name, ev := range bad {
		tr, err := Parse(wrap(ev))
		if err == nil {
			_, err = tr.Validate()
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Parse([]byte(`{"traceEvents":[`)); !errors.Is(err, ErrInvalid) {
		t.Error("truncated file parsed")
	}
	if tr, err := Parse([]byte("[" + names + "]")); err != nil || len(tr.Events) != 4 {
		t.Errorf("array format: %v", err)
	}
}

// TestCreateErrorsNameThePath: a trace file that cannot be made is named
// in the error, not the temporary file beside it.
func TestCreateErrorsNameThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "t.json")
	_, err := Create(path, 0, 0)
	if err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), ".tmp") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Create in a missing directory: %v", err)
	}
}
