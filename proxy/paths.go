package proxy

import "bytes"

// confined reports whether path, which starts with prefix as received
// (the route matched it), still starts with prefix once its dot-segments
// are resolved. Only the check resolves: the raw bytes are what goes
// upstream. "." and ".." count in their percent-encoded forms too (%2e),
// and "%2F", "\" and "%5C" count as separators, since an upstream may
// decode or normalise them. A path with no dot needs no resolving.
func confined(path, prefix []byte) bool {
	if len(prefix) <= 1 || !hasDot(path) {
		return true
	}
	var stack [64][2]int // kept segments, as [start, end) into path
	n, trailing := 0, false
	for i := 0; i < len(path); {
		start := i
		for i < len(path) && sepLen(path[i:]) == 0 {
			i++
		}
		seg := path[start:i]
		if l := sepLen(path[i:]); l > 0 {
			i += l
		}
		trailing = false
		switch {
		case len(seg) == 0:
		case isDot(seg, 1):
			trailing = true
		case isDot(seg, 2):
			n, trailing = max(n-1, 0), true
		case n == len(stack):
			return false // deeper than any route: refuse rather than guess
		default:
			stack[n] = [2]int{start, start + len(seg)}
			n++
		}
	}
	var buf [512]byte
	resolved := buf[:0]
	for _, s := range stack[:n] {
		resolved = append(append(resolved, '/'), path[s[0]:s[1]]...)
	}
	if trailing || n == 0 || sepLen(path[len(path)-1:]) > 0 {
		resolved = append(resolved, '/')
	}
	return bytes.HasPrefix(resolved, prefix)
}

// hasDot reports whether b holds a dot, written "." or "%2e".
func hasDot(b []byte) bool {
	for i, c := range b {
		if c == '.' || c == '%' && i+2 < len(b) && b[i+1] == '2' && (b[i+2] == 'e' || b[i+2] == 'E') {
			return true
		}
	}
	return false
}

// sepLen is the length of the separator b starts with: "/", "\", or
// "%2F" / "%5C" in any case; 0 for none.
func sepLen(b []byte) int {
	switch {
	case len(b) == 0:
		return 0
	case b[0] == '/' || b[0] == '\\':
		return 1
	case len(b) >= 3 && b[0] == '%' && (b[1] == '2' && (b[2] == 'f' || b[2] == 'F') || b[1] == '5' && (b[2] == 'c' || b[2] == 'C')):
		return 3
	}
	return 0
}

// isDot reports whether seg is n dots, each written "." or "%2e".
func isDot(seg []byte, n int) bool {
	for ; n > 0; n-- {
		switch {
		case len(seg) >= 1 && seg[0] == '.':
			seg = seg[1:]
		case len(seg) >= 3 && seg[0] == '%' && seg[1] == '2' && (seg[2] == 'e' || seg[2] == 'E'):
			seg = seg[3:]
		default:
			return false
		}
	}
	return len(seg) == 0
}
