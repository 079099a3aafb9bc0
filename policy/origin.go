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
	case name == "", dotted(name), !strings.Contains(name, "."), isIP(name):
		return true
	}
	return localName(name, allowed)
}

// dotted reports whether name is digits and dots only: an IPv4 address,
// or no name a page could be served from (no top-level domain is
// numeric). It spares parsing the usual Host.
func dotted(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
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

// localName reports whether name (no port) is localhost, a name under
// .localhost, or one allowed lists (lower case), whatever its case.
func localName(name string, allowed []string) bool {
	const suffix = ".localhost"
	if strings.EqualFold(name, "localhost") || len(name) > len(suffix) && strings.EqualFold(name[len(name)-len(suffix):], suffix) {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(name, a) {
			return true
		}
	}
	return false
}

// hostName is host without its port, brackets and final dot.
func hostName(host string) string {
	if strings.HasPrefix(host, "[") {
		if end := strings.IndexByte(host, ']'); end > 0 {
			return host[1:end]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host[:i], ':') < 0 {
		host = host[:i]
	}
	return strings.TrimSuffix(host, ".")
}

// isIP reports whether name is an IP address.
func isIP(name string) bool {
	_, err := netip.ParseAddr(name)
	return err == nil
}
