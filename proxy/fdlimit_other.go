//go:build !unix

package proxy

// openFileLimit has no portable source outside unix: a common default.
func openFileLimit() uint64 { return 1024 }
