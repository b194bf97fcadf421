package kernels

import (
	"regexp"
	"strconv"
	"strings"
)

// NVRTC's front end writes a diagnostic as
//
//	selftest.cu(12): error: identifier "foo" is undefined
//	        foo(x);
//	        ^
//
// (the name is the program or header name given to NVRTC; older front ends
// write `"selftest.cu", line 12: error: ...`). RewriteLog turns the first line
// into the form compilers and editors share, "selftest.cu:12:9: error: ...",
// taking the column from the caret line, and keeps the quoted source and caret
// lines so the log stays readable.
var (
	diagParenRE = regexp.MustCompile(`^(.+?)\((\d+)\): (.*)$`)
	diagQuoteRE = regexp.MustCompile(`^"(.+?)", line (\d+): (.*)$`)
)

// RewriteLog rewrites an NVRTC log to file:line[:col] form. files maps the
// names NVRTC saw (program and header names) to their contents; they are used
// to compute the column from the caret line. Lines that are not diagnostics
// are kept as they are. The result has no trailing blank lines.
func RewriteLog(log string, files map[string]string) string {
	if log == "" {
		return ""
	}
	lines := strings.Split(strings.ReplaceAll(log, "\r\n", "\n"), "\n")
	out := make([]string, 0, len(lines))
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		name, lineNo, msg, ok := parseDiag(l)
		if !ok {
			out = append(out, l)
			continue
		}
		col := 0
		// Source line, then caret line.
		if i+2 < len(lines) && isCaretLine(lines[i+2]) {
			col = column(files, name, lineNo, lines[i+1], lines[i+2])
		}
		loc := name + ":" + strconv.Itoa(lineNo)
		if col > 0 {
			loc += ":" + strconv.Itoa(col)
		}
		out = append(out, loc+": "+msg)
	}
	for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
		out = out[:len(out)-1]
	}
	return strings.Join(out, "\n")
}

func parseDiag(l string) (name string, line int, msg string, ok bool) {
	m := diagParenRE.FindStringSubmatch(l)
	if m == nil {
		m = diagQuoteRE.FindStringSubmatch(l)
	}
	if m == nil || strings.HasPrefix(l, " ") {
		return "", 0, "", false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil || n <= 0 {
		return "", 0, "", false
	}
	return m[1], n, m[3], true
}

func isCaretLine(l string) bool {
	t := strings.TrimLeft(l, " \t")
	return strings.TrimRight(t, " \t") == "^"
}

// column maps the caret's position under the quoted source line back to a
// 1-based byte column of the original line. Without the original it counts
// from the quoted line's own start, assuming NVRTC quoted it whole.
func column(files map[string]string, name string, lineNo int, quoted, caret string) int {
	caretAt := strings.IndexByte(caret, '^')
	src, have := files[name]
	if have {
		srcLines := strings.Split(src, "\n")
		if lineNo <= len(srcLines) {
			orig := strings.TrimRight(srcLines[lineNo-1], " \t\r")
			q := strings.TrimRight(quoted, " \t\r")
			if orig != "" && strings.HasSuffix(q, orig) {
				if c := caretAt - (len(q) - len(orig)) + 1; c >= 1 {
					return c
				}
			}
			// The quote may re-indent the line: match on the trimmed text.
			ot, qt := strings.TrimLeft(orig, " \t"), strings.TrimLeft(q, " \t")
			if ot != "" && ot == qt {
				c := caretAt - (len(q) - len(qt)) + (len(orig) - len(ot)) + 1
				if c >= 1 {
					return c
				}
			}
			return 0
		}
	}
	return 0
}
