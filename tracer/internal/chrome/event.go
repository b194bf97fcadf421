package chrome

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// AppendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				switch c {
				case '\n':
					b = append(b, '\\', 'n')
				case '\t':
					b = append(b, '\\', 't')
				case '\r':
					b = append(b, '\\', 'r')
				default:
					b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
				}
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, "\\ufffd"...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// AppendMicros appends ns as microseconds with three decimals (ns precision).
func AppendMicros(b []byte, ns int64) []byte {
	if ns < 0 {
		b = append(b, '-')
		ns = -ns
	}
	b = strconv.AppendInt(b, ns/1000, 10)
	f := ns % 1000
	return append(b, '.', byte('0'+f/100), byte('0'+f/10%10), byte('0'+f%10))
}

// AppendFloat appends a finite float as JSON (non-finite values as 0).
func AppendFloat(b []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, '0')
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// Head starts an event: {"ph":"X","name":...,"cat":...,"ts":...,"pid":...,"tid":...
// cat is left out when empty. The caller appends the rest and '}'.
func Head(b []byte, ph byte, name, cat string, tsNS int64, pid, tid uint32) []byte {
	b = append(b, `{"ph":"`...)
	b = append(b, ph, '"')
	b = append(b, `,"name":`...)
	b = AppendString(b, name)
	if cat != "" {
		b = append(b, `,"cat":`...)
		b = AppendString(b, cat)
	}
	b = append(b, `,"ts":`...)
	b = AppendMicros(b, tsNS)
	b = append(b, `,"pid":`...)
	b = strconv.AppendUint(b, uint64(pid), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendUint(b, uint64(tid), 10)
	return b
}

// Meta is an M event naming a process ("process_name") or thread ("thread_name").
func Meta(b []byte, kind string, pid, tid uint32, name string) []byte {
	b = Head(b, 'M', kind, "", 0, pid, tid)
	b = append(b, `,"args":{"name":`...)
	b = AppendString(b, name)
	return append(b, "}}"...)
}
