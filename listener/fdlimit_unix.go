//go:build unix

package listener

import "syscall"

// OpenFileLimit is the process's soft limit on open file descriptors (Go
// raises it to the hard limit at start).
func OpenFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1024
	}
	return r.Cur
}
