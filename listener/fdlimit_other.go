//go:build !unix

package listener

// OpenFileLimit has no portable source outside unix: a common default.
func OpenFileLimit() uint64 { return 1024 }
