// Package units holds the units a config value is written in —
// durations ("2s"), shares ("50%"), sizes ("32MiB") — decoded from YAML
// with an error that names the value, and TypeError, the way such an
// error is reported so the loader collects every one with its line. It is
// a leaf: the packages that declare config types (config, upstream) use it.
//
//	units.go   Duration, Percent, Size (ParseSize), Enum, TypeError
package units

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as "250ms", "2s", "1m30s".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string; a non-negative number is
// not accepted without a unit, to keep "30" from meaning 30ns.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil || n.Kind != yaml.ScalarNode {
		return TypeError(n, "invalid duration %q (want e.g. 250ms, 2s, 1m30s)", n.Value)
	}
	if v < 0 {
		return TypeError(n, "duration %q must not be negative", n.Value)
	}
	*d = Duration(v)
	return nil
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// Percent is a share written as "50%" or 0.5.
type Percent float64

// UnmarshalYAML parses a percentage or a fraction.
func (v *Percent) UnmarshalYAML(n *yaml.Node) error {
	s := strings.TrimSpace(n.Value)
	div := 1.0
	if t, ok := strings.CutSuffix(s, "%"); ok {
		s, div = strings.TrimSpace(t), 100
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || n.Kind != yaml.ScalarNode {
		return TypeError(n, "invalid share %q (want e.g. 50%% or 0.5)", n.Value)
	}
	*v = Percent(f / div)
	return nil
}

// Size is a byte count written as 1048576, "512KiB", "32MiB", "1MB".
type Size int64

var sizeUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseSize parses plain bytes or a number with a KB/KiB/MB/MiB/GB/GiB
// suffix.
func ParseSize(s string) (Size, error) {
	s = strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, factor = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/factor {
		return 0, fmt.Errorf("invalid size")
	}
	return Size(n * factor), nil
}

// UnmarshalYAML parses a size.
func (z *Size) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseSize(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return TypeError(n, "invalid size %q (want bytes, or e.g. 512KiB, 32MiB, 1MB)", n.Value)
	}
	*z = v
	return nil
}

// TypeError reports a bad value the way yaml reports its own, so the loader
// collects every such error with its line instead of stopping at the first.
func TypeError(n *yaml.Node, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d:%d: ", n.Line, n.Column) + fmt.Sprintf(format, args...)}}
}

// Enum decodes a scalar written as one of names' keys into its value;
// anything else is a TypeError saying what is wanted ("least_requests,
// round_robin or affinity") and what was got.
func Enum[T any](n *yaml.Node, names map[string]T, want string) (T, error) {
	var zero T
	if n.Kind != yaml.ScalarNode {
		got := "a list"
		if n.Kind == yaml.MappingNode {
			got = "a mapping (key: value)"
		}
		return zero, TypeError(n, "must be %s (got %s)", want, got)
	}
	v, ok := names[n.Value]
	if !ok {
		return zero, TypeError(n, "must be %s (got %q)", want, n.Value)
	}
	return v, nil
}
