package policy

import (
	"net/netip"
	"strings"
)

// LocalHost reports whether a request's Host may reach a listener on
// loopback. A web page that rebinds its own name to 127.0.0.1 sends that
// name: a name of several labels is refused unless allowed lists it.
// No Host, an IP address, a single label (a compose service, /etc/hosts)
// and localhost or *.localhost are local; allowed holds lower-case names.
func LocalHost(host string, allowed []string) bool {
	name := hostName(host)
	switch {
	case name == "", !strings.Contains(name, "."), isIP(name):
		return true
	}
	return localName(name, allowed)
}

// LocalOrigin reports whether a browser's Origin may call a listener on
// loopback: a page on this machine (loopback address, localhost), on
// the request's own Host, or on a name allowed lists. "null" (a sandbox,
// a file) and every other page are foreign.
func LocalOrigin(origin, host string, allowed []string) bool {
	rest, ok := strings.CutPrefix(origin, "http://")
	if !ok {
		if rest, ok = strings.CutPrefix(origin, "https://"); !ok {
			return false
		}
	}
	if strings.EqualFold(rest, host) {
		return true // same origin
	}
	name := hostName(rest)
	if a, err := netip.ParseAddr(name); err == nil {
		return a.Unmap().IsLoopback()
	}
	return name != "" && localName(name, allowed)
}

// CORSAllowed reports whether a browser page at origin gets permission
// to call Sturdy across origins: origins lists it exactly, or holds "*".
func CORSAllowed(origin string, origins []string) bool {
	for _, o := range origins {
		if o == "*" || o == origin {
			return true
		}
	}
	return false
}

// localName reports whether name (lower-case, no port) is localhost, a
// name under .localhost, or one allowed lists.
func localName(name string, allowed []string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	for _, a := range allowed {
		if name == a {
			return true
		}
	}
	return false
}

// hostName is host without its port, brackets and final dot, in lower
// case.
func hostName(host string) string {
	if strings.HasPrefix(host, "[") {
		if end := strings.IndexByte(host, ']'); end > 0 {
			return host[1:end]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.Count(host, ":") == 1 {
		host = host[:i]
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// isIP reports whether name is an IP address.
func isIP(name string) bool {
	_, err := netip.ParseAddr(name)
	return err == nil
}
