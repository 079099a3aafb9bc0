//go:build !linux

package listener

// Outside Linux, client connections are not watched: a client that
// leaves is noticed when a write to it fails, as before.
func watch(*Conn)   {}
func unwatch(*Conn) {}

// WatchClients is read by Linux builds only.
var WatchClients = true
