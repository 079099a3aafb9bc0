package policy

import "testing"

func TestLocalHost(t *testing.T) {
	t.Parallel()
	allowed := []string{"box.lan"}
	for _, tt := range []struct {
		host string
		want bool
	}{
		{"", true}, {"127.0.0.1:8080", true}, {"[::1]:8080", true}, {"::1", true}, {"10.0.0.5", true},
		{"localhost", true}, {"LOCALHOST:8080", true}, {"app.localhost:3000", true}, {"sturdy:8080", true}, {"x", true},
		{"box.lan:8080", true}, {"BOX.LAN.", true},
		{"rebind.attacker.example", false}, {"rebind.attacker.example:8080", false}, {"localhost.attacker.example", false},
		{"box.lan.attacker.example", false},
	} {
		if got := LocalHost(tt.host, allowed); got != tt.want {
			t.Errorf("LocalHost(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestLocalOrigin(t *testing.T) {
	t.Parallel()
	allowed := []string{"box.lan"}
	for _, tt := range []struct {
		origin, host string
		want         bool
	}{
		{"http://127.0.0.1:9090", "127.0.0.1:9090", true},
		{"http://localhost:3000", "127.0.0.1:8080", true},
		{"http://127.0.0.1:3000", "127.0.0.1:8080", true},
		{"http://[::1]:3000", "127.0.0.1:8080", true},
		{"https://box.lan", "127.0.0.1:8080", true},
		{"http://sturdy:8080", "sturdy:8080", true},
		{"http://rebind.attacker.example", "rebind.attacker.example", true}, // same origin: the Host check refuses it
		{"https://attacker.example", "127.0.0.1:8080", false},
		{"http://10.0.0.5", "127.0.0.1:8080", false},
		{"http://intranet", "127.0.0.1:8080", false},
		{"null", "127.0.0.1:8080", false},
		{"file://", "127.0.0.1:8080", false},
	} {
		if got := LocalOrigin(tt.origin, tt.host, allowed); got != tt.want {
			t.Errorf("LocalOrigin(%q, %q) = %v, want %v", tt.origin, tt.host, got, tt.want)
		}
	}
}

func TestCORSAllowed(t *testing.T) {
	t.Parallel()
	if CORSAllowed("http://localhost:3000", nil) || !CORSAllowed("http://localhost:3000", []string{"http://localhost:3000"}) ||
		CORSAllowed("http://localhost:3001", []string{"http://localhost:3000"}) || !CORSAllowed("https://x.example", []string{"*"}) {
		t.Fatal("CORSAllowed")
	}
}
