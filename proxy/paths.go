package proxy

import "bytes"

// confined reports whether path, which starts with prefix as received
// (the route matched it), still starts with prefix once its dot-segments
// are resolved. Only the check resolves: the raw bytes are what goes
// upstream. "." and ".." count in their percent-encoded forms too (%2e),
// and with ";params" after them (servers that strip matrix parameters
// see a dot-segment); "%2F", "\" and "%5C" count as separators, in the
// prefix too, since an upstream may decode or normalise them. A path with
// no dot needs no resolving.
func confined(path, prefix []byte) bool {
	if len(prefix) <= 1 || !hasDot(path) {
		return true
	}
	var stack [64][2]int // kept segments, as [start, end) into path
	var pbuf, rbuf [512]byte
	n, trailing, overflow := 0, false, false
	forSegments(path, func(seg []byte, start int, last bool) {
		trailing = false
		switch {
		case len(seg) == 0:
		case isDot(seg, 1):
			trailing = true
		case isDot(seg, 2):
			n, trailing = max(n-1, 0), true
		case n == len(stack):
			overflow = true // deeper than any route: refuse rather than guess
		default:
			stack[n] = [2]int{start, start + len(seg)}
			n++
		}
		trailing = trailing || last && len(seg) == 0
	})
	if overflow {
		return false
	}
	resolved := rbuf[:0]
	for _, s := range stack[:n] {
		resolved = append(append(resolved, '/'), path[s[0]:s[1]]...)
	}
	if trailing || n == 0 {
		resolved = append(resolved, '/')
	}
	return bytes.HasPrefix(resolved, canonical(prefix, pbuf[:0]))
}

// forSegments calls f for each segment of path between separators, with
// its offset; last is set for the final one (empty when path ends with a
// separator).
func forSegments(path []byte, f func(seg []byte, start int, last bool)) {
	for i := 0; ; {
		start := i
		for i < len(path) && sepLen(path[i:]) == 0 {
			i++
		}
		l := sepLen(path[i:])
		f(path[start:i], start, l == 0)
		if l == 0 {
			return
		}
		i += l
	}
}

// canonical writes prefix with every separator as "/" into dst: what a
// resolved path is compared with.
func canonical(prefix, dst []byte) []byte {
	first := true
	forSegments(prefix, func(seg []byte, _ int, last bool) {
		if !first {
			dst = append(dst, '/')
		}
		first = false
		dst = append(dst, seg...)
	})
	return dst
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

// isDot reports whether seg is n dots, each written "." or "%2e",
// before any ";" (or "%3B") parameters.
func isDot(seg []byte, n int) bool {
	if i := bytes.IndexByte(seg, ';'); i >= 0 {
		seg = seg[:i]
	}
	for i := 0; i+2 < len(seg); i++ {
		if seg[i] == '%' && seg[i+1] == '3' && (seg[i+2] == 'b' || seg[i+2] == 'B') {
			seg = seg[:i]
			break
		}
	}
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

// rawPath is the request URI up to the query (or a fragment), as
// received.
func rawPath(uri []byte) []byte {
	if i := bytes.IndexAny(uri, "?#"); i >= 0 { // a fragment is refused (malformed), in its path's API's shape
		return uri[:i]
	}
	return uri
}
